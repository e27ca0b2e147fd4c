// The trials table: a click on a column sorts by it, the search box keeps the rows that hold
// every word typed, and a page of 100 rows shows at a time (a sweep may have 10,000 trials).
(() => {
  const table = document.getElementById('trials'), body = table.tBodies[0];
  const search = document.getElementById('trial-search'), info = document.getElementById('trial-page');
  const prev = document.getElementById('trial-prev'), next = document.getElementById('trial-next');
  const size = 100;
  let all = Array.from(body.rows), shown = all, page = 0;
  const text = new Map(all.map(r => [r, Array.from(r.cells, c => c.textContent).join(' ').toLowerCase()]));
  const filter = () => {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    shown = words.length ? all.filter(r => words.every(w => text.get(r).includes(w))) : all;
  };
  const render = () => {
    const pages = Math.max(1, Math.ceil(shown.length / size));
    page = Math.max(0, Math.min(page, pages - 1));
    body.replaceChildren(...shown.slice(page * size, (page + 1) * size));
    const first = shown.length ? page * size + 1 : 0, last = Math.min(shown.length, (page + 1) * size);
    info.textContent = `rows ${first}-${last} of ${shown.length}` + (shown === all ? '' : ` (of ${all.length} trials)`);
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  };
  search.addEventListener('input', () => { filter(); page = 0; render(); });
  prev.addEventListener('click', () => { page -= 1; render(); });
  next.addEventListener('click', () => { page += 1; render(); });
  table.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
    const up = th.dataset.order !== 'asc';
    th.dataset.order = up ? 'asc' : 'desc';
    const value = r => { const t = r.cells[i].textContent; const n = parseFloat(t); return isNaN(n) ? t : n; };
    const keyed = all.map(r => [value(r), r]);
    keyed.sort(([a], [b]) => (a > b ? 1 : a < b ? -1 : 0) * (up ? 1 : -1));
    all = keyed.map(([, r]) => r);
    filter();
    render();
  }));
  render();
})();
