"""The sweep's Optuna study as its drivers open it."""

from __future__ import annotations

import pytest

from sweeps import spec as spec_lib
from sweeps.search import open_study
from tests.sweep_helpers import STUDIES


@pytest.mark.parametrize("sampler", ["tpe", "random", "nsga2"])
def test_a_resumed_driver_proposes_new_parameters_and_a_new_sweep_the_seeded_ones(tmp_path, sampler):
    """Optuna keeps no sampler state in the storage: a resumed driver whose sampler had the sweep's
    seed would propose the first trials' parameters again (TPE's first ten are its random draws)."""
    spec = spec_lib.load(STUDIES / "quickstart.yaml", [f"sampler.type={sampler}", "trials.total=6"])

    def proposals(name: str, drivers: int) -> list[dict]:
        url = f"sqlite:///{tmp_path}/{name}.db"
        for _ in range(drivers):  # each driver runs its share of the trials and dies, as after a SIGKILL
            study = open_study(spec, url, name, 6, "fingerprint")
            for _ in range(6 // drivers):
                study.study.tell(study.next_trial().number, 0.5)
        return [t.params for t in study.trials()]

    resumed = proposals("resumed", drivers=3)
    assert len({tuple(sorted(p.items())) for p in resumed}) == 6, resumed
    assert proposals("again", drivers=1)[:2] == proposals("once", drivers=1)[:2]  # a sweep's seed still holds
    assert resumed[:2] == proposals("first", drivers=1)[:2]  # the first driver is the sweep as it would run alone
