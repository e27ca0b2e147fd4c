document.querySelectorAll('#trials th').forEach((th, i) => th.addEventListener('click', () => {
  const body = th.closest('table').tBodies[0];
  const rows = Array.from(body.rows);
  const up = th.dataset.order !== 'asc';
  th.dataset.order = up ? 'asc' : 'desc';
  const value = r => { const t = r.cells[i].textContent; const n = parseFloat(t); return isNaN(n) ? t : n; };
  rows.sort((a, b) => (value(a) > value(b) ? 1 : value(a) < value(b) ? -1 : 0) * (up ? 1 : -1));
  rows.forEach(r => body.appendChild(r));
}));
