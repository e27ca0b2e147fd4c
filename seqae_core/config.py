"""Configuration: one frozen dataclass per concern, built from YAML files and ``--set`` overrides.

Keys are addressed as ``section.field`` (``model.latent_len``). The dataclasses are pydantic's, whose
types check each value (as the sweep file's sections do); every user mistake raises
:class:`ConfigError` with the key, the value and where it came from, before any data loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BeforeValidator, ConfigDict, ValidationError
from pydantic.dataclasses import dataclass
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

from seqae_errors import ConfigError


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _number(value: Any) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return float(value)
    elif not isinstance(value, (int, float)):  # pydantic's strict float takes any __float__: numpy's True
        raise ValueError("not a number")
    return value


# The types of the keys, validated strictly (``true`` is not 1, ``"64"`` not 64, no NaN or infinity),
# with two readings YAML needs: a whole float (``2.0``) is an integer, and a number YAML leaves a
# string (``1e-3``: YAML 1.1 wants a dot) is a number, as float() reads it.
Whole = Annotated[int, BeforeValidator(_whole)]
Number = Annotated[float, BeforeValidator(_number)]
SCHEMA = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

# A key's value once checked (every field below holds one of these), and a whole config's
# ``{"model.d_model": 256, ...}`` (:meth:`Config.flat`), as checkpoints and trackers keep it.
FlatValue = str | int | float | bool | None
Flat = dict[str, FlatValue]
# ``{key: value}`` as a file or ``--set`` gives it, before :func:`coerce` checks each value (a
# YAML value: also a list or a mapping, which the check refuses by name).
Layer = Mapping[str, object]


@dataclass(frozen=True, config=SCHEMA)
class DataConfig:
    path: str = "wikimedia/wikipedia"  # Hub id or a local folder in the same layout
    name: str | None = "20231101.en"  # dataset config; the paper used 20220301.en of `wikipedia`
    split: str = "train"  # the dataset split the pages come from (validation and test are drawn from it)
    text_column: str = "text"  # the column holding each page's text
    tokenizer: str = "bert-base-uncased"  # Hugging Face tokenizer id or folder (the paper: BERT's)
    input_len: Whole = 512  # N: tokens per sample, the encoder's input and the decoder's output
    samples: Literal["first", "windows"] = "first"  # first: one sample per page (the paper)
    # tokenizer: the tokenizer's ids (the paper); corpus: only the ids that occur in the data,
    # renumbered, so the vocabulary head is smaller (see seqae_core.data)
    vocab: Literal["tokenizer", "corpus"] = "tokenizer"
    max_pages: Whole | None = None  # None: every page; the paper used the first 30%
    val_fraction: Number = 0.2  # share of the pages the search selects on (the paper's 20%)
    split_seed: Whole = 0  # draws the validation pages from those that are not test pages
    # Share of the pages held out for the test split, which nothing selects on: a page is a test
    # page when a number drawn for it from test_seed falls below test_fraction, so the same pages
    # stay out whatever max_pages, val_fraction and split_seed are. 0: no test split (the paper's 80/20).
    test_fraction: Number = 0.0
    test_seed: Whole = 0  # draws the test pages (see test_fraction)


@dataclass(frozen=True, config=SCHEMA)
class ModelConfig:
    # paper: the reducing attention alone (the paper's); transformer: with a residual, LayerNorm and an FFN
    block: Literal["paper", "transformer"] = "paper"
    # Exactly one of latent_len / latent_fraction may be set; neither means half the input.
    latent_len: Whole | None = None
    latent_fraction: Number | None = None  # latent tokens as a share of input_len (the other way to set latent_len)
    # Each latent token's width: the encoder's output is projected to it and back before the
    # decoder, so a latent can be narrowed as well as shortened; None keeps d_model.
    latent_dim: Whole | None = None
    d_model: Whole = 256  # embedding width (paper: 256)
    d_attn: Whole = 512  # width of Q, K, V (paper: 512)
    heads: Whole = 1  # attention heads (the paper: 1)
    d_ffn: Whole = 1024  # FFN hidden width, transformer blocks only
    dropout: Number = 0.0  # on attention weights and block outputs (the paper: none)
    pos_encoding: Literal["learned", "sinusoidal", "none"] = "learned"  # positions added to the token embeddings
    layers: Whole = 1  # blocks per side
    # The vocabulary head shares the token embedding (as in BERT), so a token never seen in
    # training can still be reconstructed: its embedding reaches the head unchanged.
    tie_embeddings: bool = True
    reduction: Literal["gradual", "once"] = "gradual"  # with layers > 1: shrink step by step, or in block 1
    # The paper block's options, all off in the paper (the transformer block always has both a
    # residual and a LayerNorm): a residual path resampled by the block's own W_S, ``W_S X +
    # attention(X)``, which the laptop-scale ablation found to be what the block needs to learn;
    # and a LayerNorm before the attention.
    residual: bool = False
    norm: bool = False  # the paper block's LayerNorm before the attention (see residual)
    w_s_init: Literal["interpolate", "random"] = "interpolate"  # W_S's start: linear interpolation, or N(0, 1/n_in)


@dataclass(frozen=True, config=SCHEMA)
class TrainConfig:
    lr: Number = 1e-3  # start learning rate
    lr_final: Number = 1e-4  # reached after lr_decay_epochs, then constant
    lr_decay_epochs: Whole = 5  # epochs from lr to lr_final (the paper: 5)
    # paper: linear for input_len <= 256, else lr_final throughout (the paper's rule);
    # linear: from lr to lr_final over lr_decay_epochs, then constant; constant: lr throughout
    lr_schedule: Literal["paper", "linear", "constant"] = "paper"
    weight_decay: Number = 0.01  # AdamW's (its default)
    epochs: Whole = 20  # at most this many (the paper: 20), fewer when patience stops it
    patience: Whole = 5  # epochs without a better val_token_accuracy before stopping
    batch_size: Whole = 16  # samples per optimizer step (the paper: 16)
    seed: Whole = 0  # initial weights and batch order
    # models trained side by side, seeds seed, seed + 1, ...: the run's metrics, early stopping and a
    # sweep's objective are their mean (see seqae_core.metrics.across_seeds)
    repeats: Whole = 1
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 autocast on CUDA and bf16-native CPUs
    # a point of the training-loss curve every N optimizer steps (besides each epoch's mean)
    log_every_steps: Whole = 20
    # Validate (a result: a report, a checkpoint, a scheduler's decision) every N optimizer steps
    # (a whole number) or every 1/k of an epoch (0.5, 0.25, ...), and always at an epoch's end;
    # None: once an epoch. train.patience stays in epochs (patience x validations an epoch).
    validate_every: Whole | Number | None = None
    # The vocabulary head's loss (seqae_core.loss): auto is chunked on a CPU, on a GPU fused where
    # Liger-Kernel is installed (the gpu extra), else dense; every way gives the same loss and gradients.
    head: Literal["auto", "chunked", "dense", "fused"] = "auto"
    # torch.compile the step's forward and loss (seqae_core.step): on, off, or auto (off until measured to pay)
    compile: Literal["auto", "on", "off"] = "auto"
    # Train train.repeats' seeds as one batched model (seqae_core.fused), each seed's metrics and
    # checkpoint as when they train one after another: on, off, or auto, which fuses only on a device
    # where seqae bench fuse measured the pack faster: none yet (a CPU measured slower, a GPU is not
    # measured; docs/explanation/performance.md). With dropout the fused seeds' masks are other
    # draws of the same distribution; not with train.compile=on.
    fuse_repeats: Literal["auto", "on", "off"] = "auto"


@dataclass(frozen=True, config=SCHEMA)
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    @property
    def latent_len(self) -> int:
        """The latent length, resolved from ``model.latent_len`` or ``model.latent_fraction``."""
        if self.model.latent_len is not None:
            return self.model.latent_len
        fraction = 0.5 if self.model.latent_fraction is None else self.model.latent_fraction
        return max(1, round(fraction * self.data.input_len))

    @property
    def latent_fraction(self) -> float:
        return self.latent_len / self.data.input_len

    @property
    def latent_floats(self) -> int:
        """The floats one sample's latent holds: latent_len tokens of ``model.latent_dim`` each
        (``model.d_model`` unless narrowed)."""
        return self.latent_len * (self.model.latent_dim or self.model.d_model)

    @property
    def latent_share(self) -> float:
        """The latent's floats as a share of the embedded input's (input_len x d_model): how far a
        sample is compressed, whether by fewer tokens or narrower ones."""
        return self.latent_floats / (self.data.input_len * self.model.d_model)

    def flat(self) -> Flat:
        """``{"data.path": ..., "model.d_model": ...}``: every key, defaults included."""
        return {key: getattr(getattr(self, key.split(".")[0]), key.split(".")[1]) for key in KEYS}


# The keys that set no tensor's shape nor anything a batched step shares: trials that differ only in
# them train as one pack (a sweep's resources.fuse, seqae_core.fused), each member with its own values.
FREE_KEYS = (
    "train.lr",
    "train.lr_final",
    "train.lr_decay_epochs",
    "train.weight_decay",
    "train.seed",
    "train.patience",
)


def fusion_key(config: Config) -> tuple[tuple[str, FlatValue], ...]:
    """What the trials of one pack share: every key but :data:`FREE_KEYS` (and
    ``train.fuse_repeats``, which is about a run's repeats)."""
    return tuple(sorted((k, v) for k, v in config.flat().items() if k not in FREE_KEYS and k != "train.fuse_repeats"))


# Each block's defaults where they differ from the paper's (the dataclasses' defaults, which the
# paper block keeps). A key set anywhere (config file, sweep file, grid, search, --set) wins.
# The transformer's were found by laptop probes at 32 -> 8 tokens, and checked on another split
# and a second corpus by `seqae bench defaults` (docs/how-to/paper-on-a-laptop.md, "The transformer block's defaults").
BLOCK_DEFAULTS: dict[str, Flat] = {
    "transformer": {"model.heads": 8, "model.dropout": 0.1, "train.lr": 2e-3},
}

SECTIONS: dict[str, type] = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig}
KEYS: tuple[str, ...] = tuple(f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls))


def _options(key: str) -> tuple[Any, ...]:
    """The types ``key`` takes: ``(int, NoneType)`` for ``model.latent_len``."""
    section, name = key.split(".", 1)
    expected = typing.get_type_hints(SECTIONS[section])[name]
    return typing.get_args(expected) if typing.get_origin(expected) in (Union, types.UnionType) else (expected,)


def accepts_float(key: str) -> bool:
    """Whether ``key`` takes fractional values (``train.lr``) rather than whole ones (``model.d_model``)."""
    return float in _options(key)


# How far 1 / train.validate_every may be from a whole number of validations an epoch: 0.333
# and 0.33 are a third; 0.3 (3.33 an epoch) is refused rather than rounded.
FRACTION_SLACK = 0.05
MAX_YAML_DEPTH = 32  # config and sweep files nest 3 or 4 levels; PyYAML's composer recurses, 2 frames a level


class YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader for what users write: no anchors and aliases, so a small file cannot
    expand into a huge one; at most MAX_YAML_DEPTH levels of nesting, where PyYAML would exhaust
    Python's stack; keys that print on one line, as messages show them; and a value its
    constructors cannot read (``!!int x``, ``2024-13-45``, 5,000 digits) a YAML error with its
    line, as a syntax error is."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # type: ignore[override]
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            raise ComposerError(None, None, "aliases are not allowed", mark)
        if self.depth == MAX_YAML_DEPTH:
            raise ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", mark)
        self.depth += 1
        node = super().compose_node(parent, index)
        self.depth -= 1
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        for key, _ in node.value:
            if isinstance(key.value, str) and not key.value.isprintable():
                raise ConstructorError(
                    None, None, f"key {key.value!r} holds a character that does not print", key.start_mark
                )
        return super().construct_mapping(node, deep)

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (AttributeError, LookupError, ValueError):  # int(), datetime(), a bool's lookup, a timestamp's match
            kind = node.tag.rsplit(":", 1)[-1]
            raise ConstructorError(
                None, None, f"not a valid {kind}: {str(node.value)[:50]!r}", node.start_mark
            ) from None


def load_yaml(text: str, what: str) -> Any:
    """The YAML in ``text``, read by :class:`YamlLoader`; a problem is a ConfigError of one line,
    ``what: problem (line L, column C)``, where PyYAML's own message spans several."""
    try:
        return yaml.load(text, Loader=YamlLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{what}: {exc.problem or exc.context}{where}") from None
    except yaml.YAMLError as exc:  # the reader's: a character YAML does not allow, with its position
        raise ConfigError(f"{what}: {' '.join(str(exc).split())}") from None


def parse_scalar(text: str) -> Any:
    """Parse a ``--set`` value: ints, floats (``1e-3`` too), booleans, null, YAML lists and
    mappings, else a string."""
    lowered = text.strip().lower()
    if lowered in ("null", "none", "~"):
        return None
    if lowered in ("true", "false"):
        return lowered == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    if text.strip()[:1] in ("[", "{"):
        return load_yaml(text, f"--set value {text!r} is not a valid list or mapping")
    return text


def coerce(key: str, value: Any, source: str) -> Any:
    """Check ``value`` against the declared type of ``key`` and return it in that type."""
    if key not in KEYS:
        raise ConfigError(f"{source}: unknown key {key!r}; known keys: {', '.join(KEYS)}")
    section, name = key.split(".", 1)
    try:  # the section's own validation of this one field (pydantic validates no default)
        return getattr(SECTIONS[section](**{name: value}), name)
    except ValidationError:
        raise ConfigError(f"{source}: {key}={value!r} must be {' or '.join(map(_type_name, _options(key)))}") from None


# How a refusal names each type a key may take
_TYPE_NAMES = {type(None): "null", int: "an integer", float: "a finite number", str: "a string", bool: "true or false"}


def _type_name(option: Any) -> str:
    if typing.get_origin(option) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(option))
    return _TYPE_NAMES[option]


def flatten(tree: object, source: str, prefix: str = "") -> dict[str, object]:
    """``{"model": {"d_model": 64}}`` -> ``{"model.d_model": 64}``; sections must be mappings."""
    if not isinstance(tree, dict):
        raise ConfigError(f"{source}: {prefix.rstrip('.') or 'the document'} must be a mapping, got {tree!r}")
    flat: dict[str, object] = {}
    for key, value in tree.items():
        if not isinstance(key, str):
            raise ConfigError(f"{source}: key {key!r} must be a string")
        if "." in key:  # already dotted, as in sweep files' grid and search sections
            flat[prefix + key] = value
        elif isinstance(value, dict) and (value or not prefix):  # an empty section is no key
            flat.update(flatten(value, source, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def parse_sets(sets: list[str] | tuple[str, ...]) -> dict[str, object]:
    """``["train.lr=1e-3"]`` -> ``{"train.lr": 0.001}`` (types are checked later, by :func:`build`)."""
    parsed: dict[str, object] = {}
    for item in sets:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. --set model.latent_len=16")
        if not key.strip().isprintable():  # as in YAML files: messages show keys as they are
            raise ConfigError(f"--set {item!r}: the key holds a character that does not print")
        parsed[key.strip()] = parse_scalar(text)
    return parsed


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return load_yaml(text, f"{path}: not valid YAML")


def build(layers: Sequence[tuple[str, Layer]]) -> Config:
    """Merge flat ``(source, {key: value})`` layers, later ones winning, into a checked :class:`Config`."""
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source, layer in layers:
        for key, value in layer.items():
            values[key] = coerce(key, value, source)
            origin[key] = source
    block = values.get("model.block", ModelConfig.block)
    for key, value in BLOCK_DEFAULTS.get(block, {}).items():
        if key not in values:
            values[key], origin[key] = value, f"the {block} block's defaults"
    sections = {
        name: cls(**{k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(name + ".")})
        for name, cls in SECTIONS.items()
    }
    config = Config(**sections)
    validate(config, origin)
    return config


def load(config_file: str | Path | None = None, sets: list[str] | tuple[str, ...] = ()) -> Config:
    """The config of ``seqae train --config FILE --set ...``."""
    layers: list[tuple[str, Layer]] = []
    if config_file is not None:
        tree = read_yaml(config_file)
        layers.append((str(config_file), flatten(tree or {}, str(config_file))))
    layers.append(("--set", parse_sets(sets)))
    return build(layers)


def from_flat(flat: Layer, source: str = "config") -> Config:
    return build([(source, flat)])


def validate(config: Config, origin: dict[str, str] | None = None) -> None:
    """Cross-field checks; each error names the key and the value."""
    origin = origin or {}

    def fail(key: str, message: str) -> None:
        where = origin.get(key, "config")
        raise ConfigError(f"{where}: {message}")

    flat = config.flat()
    for key in (
        "data.input_len",
        "model.d_model",
        "model.d_attn",
        "model.heads",
        "model.d_ffn",
        "model.layers",
        "train.epochs",
        "train.patience",
        "train.batch_size",
        "train.lr",
        "train.lr_final",
        "train.log_every_steps",
        "train.repeats",
    ):
        value = flat[key]  # each of these keys holds a number
        if isinstance(value, (int, float)) and value <= 0:
            fail(key, f"{key}={value} must be positive")
    every = config.train.validate_every
    if (
        isinstance(every, int)
        and every < 1
        or isinstance(every, float)
        and not (0.0 < every < 1.0 and abs(1 / every - round(1 / every)) <= FRACTION_SLACK)
    ):
        fail(
            "train.validate_every",
            f"train.validate_every={every} must be a whole number of steps (1 or more) or "
            "a fraction of an epoch of the form 1/k (0.5, 0.25, 0.1, ...)",
        )
    if config.train.lr_decay_epochs < 0:
        fail("train.lr_decay_epochs", f"train.lr_decay_epochs={config.train.lr_decay_epochs} must be >= 0")
    if config.train.weight_decay < 0:
        fail("train.weight_decay", f"train.weight_decay={config.train.weight_decay} must be >= 0")
    if config.data.max_pages is not None and config.data.max_pages < 2:
        fail("data.max_pages", f"data.max_pages={config.data.max_pages} must be at least 2 (train and validation)")
    if not 0.0 < config.data.val_fraction < 1.0:
        fail("data.val_fraction", f"data.val_fraction={config.data.val_fraction} must be in (0, 1)")
    if not 0.0 <= config.data.test_fraction < 1.0 - config.data.val_fraction:
        fail(
            "data.test_fraction",
            f"data.test_fraction={config.data.test_fraction} must be in [0, 1 - "
            f"data.val_fraction={config.data.val_fraction}), to leave pages to train on",
        )
    if not 0.0 <= config.model.dropout < 1.0:
        fail("model.dropout", f"model.dropout={config.model.dropout} must be in [0, 1)")
    m, t = config.model, config.data.input_len
    if m.latent_len is not None and m.latent_fraction is not None:
        fail(
            "model.latent_fraction",
            f"set model.latent_len={m.latent_len} or model.latent_fraction={m.latent_fraction}, not both",
        )
    if m.latent_len is not None and not 1 <= m.latent_len <= t:
        fail("model.latent_len", f"model.latent_len={m.latent_len} must be in 1..data.input_len={t}")
    if m.latent_fraction is not None and not 0.0 < m.latent_fraction <= 1.0:
        fail("model.latent_fraction", f"model.latent_fraction={m.latent_fraction} must be in (0, 1]")
    if m.latent_dim is not None and not 1 <= m.latent_dim <= m.d_model:
        fail("model.latent_dim", f"model.latent_dim={m.latent_dim} must be in 1..model.d_model={m.d_model}")
    if config.train.fuse_repeats == "on" and config.train.compile == "on":
        fail(
            "train.fuse_repeats",
            "train.fuse_repeats=on cannot be used with train.compile=on (the fused step runs "
            "eagerly): set one of them to off or auto",
        )
    if m.d_attn % m.heads:
        fail("model.heads", f"model.d_attn={m.d_attn} must be divisible by model.heads={m.heads}")


def to_yaml(config: Config) -> str:
    """A nested YAML document that :func:`load` reads back to the same config."""
    return yaml.safe_dump(dataclasses.asdict(config), sort_keys=False)
