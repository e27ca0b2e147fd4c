"""The paper's claims, checked against what a sweep measured.

Each check takes plain numbers (no MLflow, no plotting) and returns a :class:`Verdict`: the claim
in words, what seqae measured, and ``reproduced``, ``not reproduced`` or ``not enough data``. The
report shows them as a table; a sweep that lacks a claim's data says so rather than guessing.

    C1 (Figs 2/3)  at 50% latent, accuracy is near-perfect (>= 0.97) for every input length
    C2 (Fig 3)     accuracy falls monotonically as the latent fraction shrinks
    C3 (Fig 3)     at 25% and below, shorter inputs lose more accuracy than longer ones
    C4 (Figs 4/5)  with a static lr of 1e-4 the seed spread is larger for short inputs than long
                   ones, and the 1e-3 -> 1e-4 warm start narrows it

``points`` below is ``{input_len: [(latent % of input, test accuracy), ...]}``; ``spreads`` is
``{(input_len, latent_len, schedule): [test accuracy per seed]}`` with ``schedule`` ``"static"`` or
``"warm"``. A claim is a measurement only on a sweep that studies it (:func:`not_studied`): a grid
over the cells the claim names with the configuration otherwise held fixed, and seeds where the
claim is about spread; a learning-rate search that happens to run at 50% latent does not test C1.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sweeps.spec.sweep import SweepSpec

REPRODUCED, NOT_REPRODUCED, NO_DATA = "reproduced", "not reproduced", "not enough data"
NOT_TESTED = "not tested by this sweep"
LATENT_KEYS = ("model.latent_fraction", "model.latent_len")
SCHEDULE_KEYS = ("train.lr", "train.lr_schedule", "train.lr_final")  # C4 compares two schedules
NEAR_PERFECT = 0.97
# Accuracy differences below this are noise between single runs, not a trend (one run per cell).
TOLERANCE = 0.005

# The paper's published values (its text and Fig. 3, 512 input tokens), drawn as reference markers.
PAPER_512 = [
    (50.0, 1.0, "512 to 256: about 1.0"),
    (30.0, 0.9, "30%: still above 0.9"),
    (25.0, 0.9, "512 to 128: about 0.9"),
]

Points = dict[int, list[tuple[float, float]]]
Spreads = dict[tuple[int, int, str], list[float]]


@dataclass(frozen=True)
class Verdict:
    claim: str
    text: str
    measured: str
    verdict: str


def near_perfect_at_half(points: Points) -> Verdict:
    text = f"At 50% latent, accuracy is near-perfect (>= {NEAR_PERFECT}) for every input length"
    at_half = {n: acc for n, series in points.items() for pct, acc in series if abs(pct - 50.0) < 1e-6}
    if not at_half:
        return Verdict("C1", text, "no trial at 50% latent", NO_DATA)
    measured = ", ".join(f"{n}: {acc:.4f}" for n, acc in sorted(at_half.items()))
    ok = all(acc >= NEAR_PERFECT for acc in at_half.values())
    return Verdict("C1", text, measured, REPRODUCED if ok else NOT_REPRODUCED)


def monotone_in_fraction(points: Points, tolerance: float = TOLERANCE) -> Verdict:
    text = "Accuracy falls monotonically as the latent fraction shrinks"
    series = {n: sorted(s, reverse=True) for n, s in points.items() if len(s) >= 3}
    if not series:
        return Verdict("C2", text, "no input length has 3 or more latent fractions", NO_DATA)
    rises = [
        f"{n}: {a:.4f} at {pa:g}% -> {b:.4f} at {pb:g}%"
        for n, s in sorted(series.items())
        for (pa, a), (pb, b) in zip(s, s[1:])
        if b > a + tolerance
    ]
    if rises:
        return Verdict("C2", text, "rises where it should fall: " + "; ".join(rises), NOT_REPRODUCED)
    return Verdict(
        "C2", text, f"monotone (within {tolerance}) for input lengths {', '.join(map(str, sorted(series)))}", REPRODUCED
    )


def short_inputs_lose_more(points: Points, tolerance: float = TOLERANCE, at_most: float = 25.0) -> Verdict:
    text = f"At {at_most:g}% latent and below, shorter inputs lose more accuracy than longer ones"
    by_pct: dict[float, dict[int, float]] = {}
    for n, series in points.items():
        for pct, acc in series:
            if pct <= at_most + 1e-6:
                by_pct.setdefault(round(pct, 2), {})[n] = acc
    compared = {pct: accs for pct, accs in sorted(by_pct.items()) if len(accs) >= 2}
    if not compared:
        return Verdict("C3", text, f"no latent fraction <= {at_most:g}% was run at two input lengths", NO_DATA)
    parts, ok = [], True
    for pct, accs in compared.items():
        lengths = sorted(accs)
        holds = all(accs[b] >= accs[a] - tolerance for a, b in zip(lengths, lengths[1:]))
        ok &= holds
        parts.append(
            f"{pct:g}%: "
            + ", ".join(f"{n}: {accs[n]:.4f}" for n in lengths)
            + (" (rises with length)" if holds else " (does not rise with length)")
        )
    return Verdict("C3", text, "; ".join(parts), REPRODUCED if ok else NOT_REPRODUCED)


def seed_spread(spreads: Spreads) -> Verdict:
    text = (
        "With a static lr of 1e-4 the seed spread is larger for short inputs than long ones, "
        "and the 1e-3 -> 1e-4 warm start narrows it"
    )
    sd = {key: statistics.stdev(values) for key, values in spreads.items() if len(values) >= 2}
    static = sorted((n, s, v) for (n, s, schedule), v in sd.items() if schedule == "static")
    pairs = [(n, s, v, sd[(n, s, "warm")]) for n, s, v in static if (n, s, "warm") in sd]
    if len(static) < 2 or not pairs:
        return Verdict(
            "C4", text, "needs 2+ seeds at two settings with a static lr, and the warm start at one", NO_DATA
        )
    wider_when_short = all(a >= b for (_, _, a), (_, _, b) in zip(static, static[1:]))
    narrowed = all(warm < cold for _, _, cold, warm in pairs)
    measured = "; ".join(f"{n}->{s}: sd {cold:.4f} static, {warm:.4f} warm" for n, s, cold, warm in pairs)
    measured += "".join(f"; {n}->{s}: sd {v:.4f} static" for n, s, v in static if (n, s, "warm") not in sd)
    measured += (
        f". The static spread {'shrinks' if wider_when_short else 'does not shrink'} with the input length; "
        f"the warm start {'narrows it at every setting' if narrowed else 'does not narrow it everywhere'}"
    )
    return Verdict("C4", text, measured, REPRODUCED if wider_when_short and narrowed else NOT_REPRODUCED)


def not_studied(spec: SweepSpec) -> dict[str, str]:
    """Why a sweep (its ``grid`` and ``search``) does not test each claim it does
    not study, ``{claim: reason}``; the claims it studies are absent. C1-C3 are about the cells of
    Fig. 3 (latent length, input length) and C4 about seeds under two learning-rate schedules: a
    grid over anything else, or a search, changes the configuration between the cells compared."""
    grid = set(spec.grid_keys())
    searched = sorted(spec.search)

    def held_fixed(allowed: set[str]) -> str | None:
        if searched:
            return f"it searches {', '.join(searched)}, so the configuration differs between trials"
        if others := sorted(grid - allowed):
            return f"its grid also varies {', '.join(others)}, so the configuration differs between cells"
        return None

    fig3 = held_fixed({*LATENT_KEYS, "data.input_len", "train.seed"}) or (
        None if grid & set(LATENT_KEYS) else "its grid does not vary the latent length"
    )
    reasons = {
        "C1": fig3,
        "C2": fig3,
        "C3": fig3 or (None if "data.input_len" in grid else "its grid does not vary the input length"),
        "C4": held_fixed({*LATENT_KEYS, "data.input_len", "train.seed", *SCHEDULE_KEYS})
        or (None if "train.seed" in grid else "its grid does not vary train.seed"),
    }
    return {claim: reason for claim, reason in reasons.items() if reason}


def check(points: Points, spreads: Spreads, skip: dict[str, str] | None = None) -> list[Verdict]:
    """Every claim, in order; a claim in ``skip`` (:func:`not_studied`) says why it is not tested."""
    verdicts = [
        near_perfect_at_half(points),
        monotone_in_fraction(points),
        short_inputs_lose_more(points),
        seed_spread(spreads),
    ]
    skip = skip or {}
    return [
        Verdict(v.claim, v.text, f"this sweep does not test it: {skip[v.claim]}", NOT_TESTED) if v.claim in skip else v
        for v in verdicts
    ]
