-- Headless Neovim (its built-in LSP client, docs/EDITORS.md's setup) against kvref server, for
-- tools/bench_neovim.py: time to the first diagnostics from :edit (the server started by the
-- FileType autocmd), then edits removing and restoring one @override line, each timed until the
-- diagnostics change. Writes JSON to KVREF_OUT.
local function now() return vim.loop.hrtime() / 1e6 end
local out = {}
local function finish(status)
  local f = io.open(vim.env.KVREF_OUT, 'w'); f:write(vim.fn.json_encode(out)); f:close()
  vim.cmd('cquit ' .. status)
end
vim.cmd('luafile ' .. vim.fn.fnameescape(vim.env.KVREF_SETUP))
local t0 = now()
vim.cmd('edit ' .. vim.fn.fnameescape(vim.env.KVREF_FILE))
local bufnr = vim.api.nvim_get_current_buf()
local function count() return #vim.diagnostic.get(bufnr) end
-- First diagnostics: the first publish for the buffer (an empty list counts too).
local published = 0
vim.api.nvim_create_autocmd('DiagnosticChanged', { buffer = bufnr, callback = function() published = published + 1 end })
local ok = vim.wait(120000, function()
  for _, c in pairs(vim.lsp.buf_get_clients(bufnr)) do if c.name == 'kvref' then return published > 0 or count() > 0 end end
  return false
end, 5)
out.first_ms = now() - t0
out.first_ok = ok
out.first_count = count()
local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
local target = nil
for i, l in ipairs(lines) do if l:match('^%s+@override%s*$') then target = i; break end end
out.target = target
out.edits = {}
local base = count()
for e = 1, tonumber(vim.env.KVREF_EDITS or '20') do
  local before = published
  local t = now()
  if e % 2 == 1 then
    vim.api.nvim_buf_set_lines(bufnr, target - 1, target, false, {})
    ok = vim.wait(10000, function() return count() == base + 1 end, 1)
  else
    vim.api.nvim_buf_set_lines(bufnr, target - 1, target - 1, false, { lines[target] })
    ok = vim.wait(10000, function() return count() == base end, 1)
  end
  table.insert(out.edits, { ms = now() - t, ok = ok })
  vim.wait(300, function() return false end, 50)
end
finish(0)
