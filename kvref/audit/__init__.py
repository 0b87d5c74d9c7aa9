"""`kvref audit`: a cross-file @override and Collection-conformance checker."""
