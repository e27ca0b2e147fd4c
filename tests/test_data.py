from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest
import torch

from seqae_core import corpus, data
from seqae_core.loss import plan_head, score, targets_of
from seqae_errors import ConfigError
from tests.conftest import WIKI_MINI


@pytest.fixture(scope="module")
def tokenizer():
    return corpus.load_tokenizer("bert-base-uncased")


@pytest.fixture(scope="module")
def pages():
    from seqae_core.config import DataConfig

    return list(corpus.iter_texts(DataConfig(path=str(WIKI_MINI), max_pages=12)))


def test_streams_the_local_folder_through_load_dataset(pages):
    assert len(pages) == 12
    assert pages[0].startswith("Homarus gammarus")


@pytest.mark.parametrize("n", [1, 16, 512, 5000])
def test_prefix_tokenization_equals_whole_page_tokenization(tokenizer, pages, n):
    whole = tokenizer(pages, add_special_tokens=False)["input_ids"]
    assert corpus.first_tokens(tokenizer, pages, n) == [tokens[:n] for tokens in whole]


def test_first_vs_windows(tiny_config, data_cache):
    # in the tokenizer's ids: a corpus vocabulary numbers each entry's ids its own way
    first = data.load(tiny_config(**{"data.samples": "first", "data.vocab": "tokenizer"}).data, data_cache)
    windows = data.load(tiny_config(**{"data.samples": "windows", "data.vocab": "tokenizer"}).data, data_cache)
    n_pages, t = 6, 16
    # first: one sample per page (all pages here are longer than 16 tokens, so none is padded)
    assert first.tokens.shape == (n_pages, t)
    assert (first.tokens != first.pad_id).all()
    # windows: consecutive windows of each page; its first window of a page is that page's `first` sample
    pages = np.load(windows.entry / "pages.npy")
    assert windows.tokens.shape[0] > 10 * n_pages
    starts = np.flatnonzero(np.diff(pages, prepend=-1))
    assert np.array_equal(windows.tokens[starts], first.tokens)
    # only each page's last window is padded, and only at its end; some are (a page's length is
    # rarely a multiple of 16), or the checks below would hold of nothing
    padded = (windows.tokens == windows.pad_id).any(axis=1)
    last_of_page = np.append(np.diff(pages) != 0, True)
    assert padded.any(), "no window is padded: nothing below is checked"
    assert not padded[~last_of_page].any()
    for row in windows.tokens[padded]:
        pad_at = np.flatnonzero(row == windows.pad_id)
        assert pad_at[-1] == t - 1 and np.all(np.diff(pad_at) == 1)


def test_corpus_vocabulary_renumbers_the_ids_the_pages_use_and_maps_back(tiny_config, data_cache, tokenizer):
    full = data.load(tiny_config(**{"data.vocab": "tokenizer"}).data, data_cache)
    corpus = data.load(tiny_config(**{"data.vocab": "corpus"}).data, data_cache)
    assert full.entry != corpus.entry  # the vocabulary is part of the cache key
    used = np.unique(np.asarray(full.tokens))
    # every id the pages use, and the pad token, in the tokenizer's order
    assert np.array_equal(corpus.token_ids, np.union1d(used, [full.pad_id]))
    assert corpus.vocab_size == len(corpus.token_ids) < full.vocab_size == len(tokenizer)
    assert corpus.token_ids[corpus.pad_id] == full.pad_id
    # mapping back gives exactly the tokenizer's samples, pads included, with the same split
    assert np.array_equal(corpus.token_ids[np.asarray(corpus.tokens)], np.asarray(full.tokens))
    assert np.array_equal(corpus.train, full.train) and np.array_equal(corpus.val, full.val)
    assert corpus.vocab() == tokenizer.convert_ids_to_tokens(corpus.token_ids.tolist())
    assert np.array_equal(full.token_ids, np.arange(full.vocab_size))


def test_split_is_by_page_and_seeded(tiny_config, data_cache):
    splits = data.load(tiny_config().data, data_cache)
    pages = np.load(splits.entry / "pages.npy")
    assert set(pages[splits.train]).isdisjoint(pages[splits.val])
    assert len(set(pages[splits.val])) == round(0.2 * 6)
    other = data.load(tiny_config(**{"data.split_seed": 1}).data, data_cache)
    assert other.entry == splits.entry  # the split does not change the cached samples
    assert not np.array_equal(other.val, splits.val)


SPLIT_PAGES = 30


def _pages_of(splits: data.Splits) -> list[set[int]]:
    pages = np.load(splits.entry / "pages.npy")
    return [set(pages[rows].tolist()) for rows in (splits.train, splits.val, splits.test)]


@pytest.mark.parametrize("split_seed, val_fraction", [(0, 0.2), (1, 0.2), (5, 0.1), (2, 0.5)])
def test_test_pages_never_reach_training_or_validation(tiny_config, data_cache, split_seed, val_fraction):
    settings = {"data.max_pages": SPLIT_PAGES, "data.test_fraction": 0.2}
    splits = data.load(
        tiny_config(**settings, **{"data.split_seed": split_seed, "data.val_fraction": val_fraction}).data, data_cache
    )
    train, val, test = _pages_of(splits)
    assert train and val and test
    assert train.isdisjoint(val) and train.isdisjoint(test) and val.isdisjoint(test)
    assert train | val | test == set(range(SPLIT_PAGES))
    assert len(val) == round(val_fraction * SPLIT_PAGES)
    # the test pages are the test seed's alone: other validation settings draw among the rest
    assert test == _pages_of(data.load(tiny_config(**settings).data, data_cache))[2]


def test_test_pages_stay_out_whatever_the_page_count_and_move_only_with_their_seed(tiny_config, data_cache):
    def test_pages(**overrides):
        return _pages_of(data.load(tiny_config(**{"data.test_fraction": 0.2, **overrides}).data, data_cache))[2]

    few, many = test_pages(**{"data.max_pages": SPLIT_PAGES}), test_pages(**{"data.max_pages": 2 * SPLIT_PAGES})
    assert few == {page for page in many if page < SPLIT_PAGES}
    assert test_pages(**{"data.max_pages": SPLIT_PAGES, "data.test_seed": 1}) != few
    assert (
        test_pages(**{"data.max_pages": 3, "data.test_fraction": 0.01}) != set()
    )  # a fraction above 0: one page at least


def test_no_test_fraction_keeps_the_paper_split(tiny_config, data_cache):
    """Without a test split, the validation pages are the first of the split seed's permutation, as ever."""
    splits = data.load(tiny_config(**{"data.max_pages": SPLIT_PAGES, "data.split_seed": 3}).data, data_cache)
    _, val, test = _pages_of(splits)
    assert test == set() and len(splits.test) == 0
    assert val == set(np.random.default_rng(3).permutation(SPLIT_PAGES)[: round(0.2 * SPLIT_PAGES)].tolist())


def test_padding_is_never_scored():
    torch.manual_seed(0)
    tokens = torch.tensor([[5, 6, 7, 0, 0], [9, 3, 0, 0, 0]])  # pad id 0
    keep = tokens != 0
    targets = targets_of(tokens, pad_id=0)
    head = torch.nn.Linear(8, 20)
    hidden = torch.randn(2, 5, 8)
    plan = plan_head("auto", torch.device("cpu"))
    loss, tally = score(hidden, head, targets, plan)
    scores = tally.read()
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(head(hidden[keep]), tokens[keep]))
    assert (scores.tokens, scores.sequences) == (5, 2)

    # A head that reads one-hot rows back: right on every real token, whatever sits at the pads.
    echo = torch.nn.Linear(20, 20)
    with torch.no_grad():
        echo.weight.copy_(torch.eye(20) * 10)
        echo.bias.zero_()
    right = torch.nn.functional.one_hot((tokens + 1) % 20, 20).float()  # wrong at every position
    right[keep] = torch.nn.functional.one_hot(tokens[keep], 20).float()  # then right at the real ones
    _, tally = score(right, echo, targets, plan)
    assert (tally.read().token_accuracy, tally.read().sequence_accuracy) == (1.0, 1.0)
    right[1, 0] = torch.nn.functional.one_hot(torch.tensor(4), 20)  # second sequence's first token wrong
    _, tally = score(right, echo, targets, plan)
    assert (tally.read().token_accuracy, tally.read().sequence_accuracy) == (0.8, 0.5)


def test_model_loss_ignores_what_sits_at_pad_positions(tiny_config):
    from seqae_core.evaluation import batch_scores
    from seqae_core.model import ReducingAutoencoder

    torch.manual_seed(0)
    model = ReducingAutoencoder(tiny_config(), 50).eval()
    tokens = torch.randint(1, 50, (2, 16))
    tokens[0, 10:] = 0
    with torch.no_grad():
        loss, tally = batch_scores(model, tokens, pad_id=0)
        logits = model(tokens)
    keep = tokens != 0
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits[keep], tokens[keep]))
    assert tally.read().tokens == 16 + 10


def test_cache_hit_miss_and_corruption(tiny_config, tmp_path, caplog):
    config = tiny_config(**{"data.max_pages": 3}).data
    entry = data.prepare(config, tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    built_at = (entry / "manifest.json").stat().st_mtime_ns

    # hit: the same entry, not rebuilt
    assert data.prepare(config, tmp_path) == entry
    assert (entry / "manifest.json").stat().st_mtime_ns == built_at

    # miss: anything that changes the samples gives another entry
    other = data.prepare(tiny_config(**{"data.max_pages": 3, "data.input_len": 8}).data, tmp_path)
    assert other != entry and other.exists()

    # corruption: a flipped byte is detected and the entry rebuilt, never used
    tokens_file = entry / "tokens.npy"
    raw = bytearray(tokens_file.read_bytes())
    raw[-1] ^= 0xFF
    tokens_file.write_bytes(bytes(raw))
    assert data.check_entry(entry, manifest["key"]) == "tokens.npy does not match its checksum"
    with caplog.at_level(logging.WARNING, logger="seqae_core.data"):
        assert data.prepare(config, tmp_path) == entry
    assert "tokens.npy does not match its checksum" in caplog.text
    assert data.check_entry(entry, manifest["key"]) is None

    # partial: an entry without its manifest (a build that died) is rebuilt
    (entry / "manifest.json").unlink()
    data.prepare(config, tmp_path)
    assert data.check_entry(entry, manifest["key"]) is None
    # truncated file
    with open(entry / "pages.npy", "r+b") as f:
        f.truncate(10)
    assert "pages.npy has 10 bytes" in data.check_entry(entry, manifest["key"])
    assert data.load(config, tmp_path).tokens.shape[0] == manifest["samples"]
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".building")]


def test_bad_dataset_settings_name_the_key(tiny_config, tmp_path):
    with pytest.raises(ConfigError, match="data.text_column='body'"):
        data.prepare(tiny_config(**{"data.text_column": "body"}).data, tmp_path)
    with pytest.raises(ConfigError, match="data.path="):
        data.prepare(tiny_config(**{"data.path": str(tmp_path / "nowhere")}).data, tmp_path)


def test_package_readmes_load_as_a_second_corpus(tmp_path):
    from research.corpora import package_descriptions
    from seqae_core.config import DataConfig

    folder = package_descriptions(tmp_path / "packages")
    texts = list(corpus.iter_texts(DataConfig(path=str(folder), max_pages=3)))
    assert len(texts) == 3 and all(len(t) >= 2000 for t in texts)
    assert not any(t.startswith("Homarus gammarus") for t in texts)


@pytest.mark.parametrize("where", ["folder", "s3"])
def test_published_entry_is_fetched_once_per_node_and_never_tokenized_there(
    where, tiny_config, tmp_path, monkeypatch, request
):
    """A driver publishes its entry to a shared folder or a real S3 server; a node with an empty
    cache fetches it (checksums verified), a second trial on that node reuses the node's copy, and
    neither touches the source or the tokenizer. A damaged published file is refused."""
    if where == "s3":
        for key, value in request.getfixturevalue("s3").items():
            monkeypatch.setenv(key, value)
    uri = f"s3://seqae/{tmp_path.name}/data" if where == "s3" else str(tmp_path / "shared" / "data")
    config = tiny_config(**{"data.max_pages": 3}).data
    entry = data.prepare(config, tmp_path / "driver")
    moved = data.publish(entry, uri)
    assert moved == sum(f.stat().st_size for f in entry.iterdir())
    assert data.publish(entry, uri) == 0  # published whole already: nothing copied again

    def never(*args, **kwargs):
        raise AssertionError("a node with published data read the source")

    monkeypatch.setattr(corpus, "iter_texts", never)
    monkeypatch.setattr(corpus, "load_tokenizer", never)
    node = tmp_path / "node"
    fetched = data.prepare(config, node, published=f"{uri}/{entry.name}")
    record = json.loads((fetched / "fetched.json").read_text())
    assert fetched.name == entry.name and record["bytes"] == moved and record["from"] == f"{uri}/{entry.name}"
    assert all((fetched / f).read_bytes() == (entry / f).read_bytes() for f in (*data.FILES, "manifest.json"))
    stamp = (fetched / "fetched.json").stat().st_mtime_ns
    assert (
        data.load(config, node, published=f"{uri}/{entry.name}").tokens.shape
        == data.load(config, tmp_path / "driver").tokens.shape
    )
    assert (fetched / "fetched.json").stat().st_mtime_ns == stamp  # the second trial reused the node's copy

    from seqae_core.storage import filesystem

    fs, root = filesystem(uri)
    with fs.open_output_stream(f"{root}/{entry.name}/pages.npy") as f:
        f.write(b"damaged")
    with pytest.raises(RuntimeError, match="unusable: pages.npy has 7 bytes"):
        data.prepare(config, tmp_path / "node2", published=f"{uri}/{entry.name}")
    with pytest.raises(RuntimeError, match="no data entry is published at"):
        data.prepare(config, tmp_path / "node3", published=f"{uri}/elsewhere")


@pytest.mark.parametrize("samples,vocab", [("first", "tokenizer"), ("windows", "corpus")])
def test_parallel_preparation_writes_the_same_entry(samples, vocab, tiny_config, tmp_path, monkeypatch):
    """Two worker processes, batches of 8 pages: byte for byte the entry one process writes."""
    monkeypatch.setattr(corpus, "PAGE_BATCH", 8)
    config = tiny_config(**{"data.max_pages": 40, "data.samples": samples, "data.vocab": vocab}).data
    key = data.cache_key(config)
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        data.build(config, key, tmp_path / str(workers), workers=workers)
    for name in data.FILES:
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes(), name
    assert sorted(p.name for p in (tmp_path / "2").iterdir()) == sorted([*data.FILES, "manifest.json"])  # no .raw left


KILL_AT = {  # the progress write (the file corpus.write_atomically replaces) the build is killed at, and when
    "rows written, batch not recorded": ("seen.npy", 3),
    "seen recorded, progress not": ("progress.json", 3),
    "files written, manifest not": ("written", 1),
}


@pytest.mark.parametrize("where", KILL_AT)
def test_a_build_killed_midway_resumes_and_writes_the_uninterrupted_entry(where, tiny_config, tmp_path):
    """A build is SIGKILLed in its own process at a point of its progress; the next prepare of
    the same entry goes on from the last recorded batch (8 pages each here) and writes, byte for
    byte, the entry an uninterrupted build writes."""
    import signal
    import subprocess
    import sys

    config = tiny_config(**{"data.max_pages": 40, "data.samples": "first", "data.vocab": "corpus"}).data
    name, count = KILL_AT[where]
    killed = tmp_path / "killed"
    script = f"""
import os, signal
from pathlib import Path
from seqae_core import corpus, data
from seqae_core.config import DataConfig
corpus.PAGE_BATCH = 8
write, calls = corpus.write_atomically, {{"seen.npy": 0, "progress.json": 0, "written": 0}}
def dying(path, data):
    kind = "written" if path.name == "progress.json" and b'"written": {{' in data else path.name
    calls[kind] += 1
    if {name!r} == kind and calls[kind] == {count}:
        os.kill(os.getpid(), signal.SIGKILL)
    write(path, data)
corpus.write_atomically = dying
data.prepare(DataConfig(**{config.__dict__!r}), Path({str(killed)!r}))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    building = [p for p in killed.iterdir() if p.name.startswith(".building-")]
    assert len(building) == 1 and (building[0] / corpus.PARTIAL / "progress.json").exists()

    original = corpus.PAGE_BATCH
    corpus.PAGE_BATCH = 8
    try:
        resumed = data.prepare(config, killed)
        uninterrupted = data.prepare(config, tmp_path / "whole")
    finally:
        corpus.PAGE_BATCH = original
    manifest = json.loads((resumed / "manifest.json").read_text())
    # killed at the 3rd batch's record, the 2 before it (16 pages) are kept; killed after the
    # files were written, all 40 are
    assert manifest["resumed_after_pages"] == (40 if name == "written" else 16)
    assert manifest["files"] == json.loads((uninterrupted / "manifest.json").read_text())["files"]
    assert not [p for p in killed.iterdir() if p.name.startswith(".building")]
    assert sorted(p.name for p in resumed.iterdir()) == sorted([*data.FILES, "manifest.json"])
