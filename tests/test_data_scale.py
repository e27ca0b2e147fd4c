"""``seqae bench data-scale``: its synthetic pages, its preparation killed and resumed, and its refusals."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks import data_scale
from seqae.cli.main import main
from seqae_core import corpus
from seqae_core.config import DataConfig
from tests.conftest import WIKI_MINI
from tests.refusal import assert_refused


def test_synthetic_pages_load_as_the_dataset_does_with_wikipedias_lengths(tmp_path):
    made = data_scale.synthetic(WIKI_MINI, tmp_path / "corpus", 20_000)
    pages = list(corpus.iter_texts(DataConfig(path=str(tmp_path / "corpus"))))  # the real loader
    assert made["pages"] == len(pages) == 20_000
    source = " ".join(" ".join(corpus.iter_texts(DataConfig(path=str(WIKI_MINI)))).split())
    for page in pages[:200]:  # whole words of the offline pages, from a word's start
        assert " ".join(page.split()) in source
    words = np.array([len(page.split()) for page in pages])
    # the drawn distribution: mean and median within 10% of Wikipedia's
    assert abs(words.mean() / data_scale.WORDS_MEAN - 1) < 0.1, words.mean()
    assert abs(np.median(words) / data_scale.WORDS_MEDIAN - 1) < 0.1, np.median(words)
    assert data_scale.synthetic(WIKI_MINI, tmp_path / "corpus", 20_000) == made  # kept for a rerun
    # datasets streams a row group at a time: the row group bounds the reader's memory
    files = sorted((tmp_path / "corpus" / "20231101.en").glob("*.parquet"))
    assert {pq.ParquetFile(f).metadata.row_group(0).num_rows for f in files} == {data_scale.ROW_GROUP}


@pytest.mark.slow
def test_the_preparation_killed_part_way_resumes_to_the_same_entry(tmp_path, monkeypatch):
    monkeypatch.delenv("SEQAE_DATA_WORKERS", raising=False)  # the bench's own 2
    rows = {row["case"]: row for row in data_scale.run(str(WIKI_MINI), 4_000, 0.2, tmp_path)}
    whole = rows["prepare, 2 workers, first 512 tokens"]
    killed, resumed = rows["killed at 20% of the pages"], rows["run again: resumed"]
    assert whole["pages"] == resumed["pages"] == 4_000 and whole["resumed_after_pages"] == 0
    # killed once 800 pages were recorded: a whole number of 512-page batches, kept, and no more
    assert killed["pages_recorded"] >= 800 and killed["pages_recorded"] % corpus.PAGE_BATCH == 0
    assert killed["pages_recorded"] <= resumed["resumed_after_pages"] < 4_000  # a batch may be recorded as it is killed
    assert resumed["same_entry_as_uninterrupted"] is True
    assert whole["entry_bytes"] > 4_000 * 512 * 2 and 0 < whole["peak_pss_mib"] <= whole["peak_rss_mib"]


@pytest.mark.parametrize(
    "args,says",
    [
        (["--data", "wikimedia/wikipedia"], "bench data-scale cuts its pages from a local folder"),
        (["--pages", "1"], "--pages 1 is too few"),
        (["--interrupt", "1.5"], "--interrupt 1.5 is not a fraction"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(args, says, capsys, tmp_path):
    out = tmp_path / "bench.json"
    code = main(
        ["bench", "data-scale", "--out", str(out), *(["--data", str(WIKI_MINI)] if "--data" not in args else []), *args]
    )
    assert_refused(code, capsys.readouterr().err, says, created=(out,))
