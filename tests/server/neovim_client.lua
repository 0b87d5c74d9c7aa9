-- Neovim 0.7's built-in LSP client against `kvref server`, headless (tests/server/test_neovim.py).
-- Runs KVREF_SETUP (docs/EDITORS.md's configuration), opens KVREF_FILE (its FileType autocmd
-- starts and attaches the server), waits for the KVR001 diagnostic, applies the preferred quick
-- fix, and writes what it saw and the buffer's lines as JSON to KVREF_OUT.
local function finish(report, status)
  local out = io.open(vim.env.KVREF_OUT, 'w')
  out:write(vim.fn.json_encode(report))
  out:close()
  vim.cmd('cquit ' .. status)
end

vim.cmd('luafile ' .. vim.fn.fnameescape(vim.env.KVREF_SETUP))
vim.cmd('edit ' .. vim.fn.fnameescape(vim.env.KVREF_FILE))
local bufnr = vim.api.nvim_get_current_buf()
local report = {}
local client_id = nil
-- A client is listed once it has initialized.
vim.wait(60000, function()
  for id, client in pairs(vim.lsp.buf_get_clients(bufnr)) do
    if client.name == 'kvref' then client_id = id end
  end
  return client_id ~= nil
end, 50)
if client_id == nil then
  report.error = 'the documented setup attached no kvref client'
  finish(report, 4)
end
if not vim.wait(60000, function() return #vim.diagnostic.get(bufnr) > 0 end, 50) then
  report.error = 'no diagnostics'
  finish(report, 3)
end
local diagnostic = vim.diagnostic.get(bufnr)[1]
local lsp = diagnostic.user_data and diagnostic.user_data.lsp or {}
report.diagnostic = {
  code = lsp.code or diagnostic.code, message = diagnostic.message,
  lnum = diagnostic.lnum, col = diagnostic.col, end_col = diagnostic.end_col,
}
local params = {
  textDocument = { uri = vim.uri_from_bufnr(bufnr) },
  range = { start = { line = diagnostic.lnum, character = diagnostic.col },
            ['end'] = { line = diagnostic.end_lnum, character = diagnostic.end_col } },
  -- What `vim.lsp.buf.code_action()` sends in 0.7: the line's diagnostics, as LSP ones.
  context = { diagnostics = vim.lsp.diagnostic.get_line_diagnostics(bufnr, diagnostic.lnum), only = { 'quickfix' } },
}
local responses = vim.lsp.buf_request_sync(bufnr, 'textDocument/codeAction', params, 60000) or {}
report.titles = {}
for _, response in pairs(responses) do
  if response.err then report.error = vim.inspect(response.err) end
  for _, action in ipairs(response.result or {}) do
    table.insert(report.titles, action.title)
    if action.isPreferred and not report.applied then
      vim.lsp.util.apply_workspace_edit(action.edit, 'utf-16')
      report.applied = action.title
    end
  end
end
report.lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
-- The fixed buffer is checked again: the finding is gone.
report.cleared = vim.wait(30000, function() return #vim.diagnostic.get(bufnr) == 0 end, 50)
vim.lsp.stop_client(client_id)
vim.wait(5000, function() return vim.lsp.get_client_by_id(client_id) == nil end, 50)
finish(report, 0)
