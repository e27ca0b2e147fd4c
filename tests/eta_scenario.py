"""The ETA against the actual for issue 81's two users (docs/explanation/performance.md): a local
cluster of 2 workers x 2 CPUs; A submits the quickstart with 8 trials at 4 at once, B the same with
4 trials 20 s later, at equal priorities. Every ~10 s: each sweep's ETA (``Sweep.eta()``, what
`seqae sweep status` computes in the driver's workspace), the queue's ETA column and the slots each
holds; at the end each sweep's actual end (its last trial's completion in Optuna), all written to
OUT/result.json. A measurement, not a test: run it alone, under the heavy lock, from the
repository's root:

    flock /tmp/seqae-heavy.lock python -m tests.eta_scenario OUT
"""

import json
import os
import sys
import time
from pathlib import Path

from optuna import load_study

from tests.conftest import REPO, WIKI_MINI
from tests.sweep_helpers import STUDIES, local_cluster, seqae, sets
from tests.test_sharing import held, jobs_ended

ISSUE = [
    f"data.path={WIKI_MINI}",
    "data.max_pages=12",
    "data.input_len=16",
    "model.latent_len=8",
    "train.epochs=3",
    "max_concurrent=4",
]
A, B = [*ISSUE, "trials.total=8"], [*ISSUE, "trials.total=4"]


def main(out: Path) -> None:
    root = out / "cluster"
    gen = local_cluster(root, workers=2, cpus_per_worker=2)
    cluster = next(gen)
    try:
        env = cluster["env"]
        os.environ.update(env)
        from seqae import Sweep, queue  # after the cluster's settings are in the environment

        def submit(name, overrides, ws):
            run = seqae(
                "sweep",
                "submit",
                str(STUDIES / "quickstart.yaml"),
                "--name",
                name,
                "--workspace",
                str(ws),
                *sets(*overrides),
                env=env,
                cwd=REPO,
            )
            assert run.returncode == 0, run.stdout + run.stderr
            return time.time()

        t0 = submit("usera", A, out / "ws-a")
        tb = None
        rows, quoted = [], {}
        while not (tb and jobs_ended(cluster, {"usera", "userb"})):
            now = time.time()
            if tb is None and now - t0 >= 20:
                tb = submit("userb", B, out / "ws-b")
            row = {"t": round(now - t0, 1), "held": held(cluster)}
            for name in ("usera", "userb"):
                try:
                    e = Sweep(name, env["SEQAE_WORKSPACE"]).eta()
                    row[name] = {
                        "seconds_left": e.seconds_left,
                        "slots": e.slots,
                        "from": e.slots_from,
                        "line": e.line(),
                    }
                except Exception as exc:  # noqa: BLE001 - its driver has not written its state yet
                    row[name] = {"error": type(exc).__name__}
            row["queue"] = {p.sweep: [p.state, p.held, p.share, p.eta_seconds] for p in queue(out / "ws-a")}
            rows.append(row)
            print(json.dumps(row), flush=True)
            if "status_b" not in quoted and tb and row["held"].get("userb", 0) and row["held"].get("usera", 0):
                quoted["status_b"] = seqae("sweep", "status", "userb", "--workspace", str(out / "ws-b"), env=env).stdout
                quoted["queue"] = seqae("cluster", "queue", "--workspace", str(out / "ws-a"), env=env).stdout
                quoted["at"] = round(time.time() - t0, 1)
            assert now - t0 < 480
            time.sleep(max(0.0, 10.0 - (time.time() - now)))
        ends = {}
        for name in ("usera", "userb"):
            study = load_study(study_name=name, storage=env["SEQAE_OPTUNA_STORAGE"])
            ends[name] = max(t.datetime_complete.timestamp() for t in study.trials if t.datetime_complete) - t0
            ends[name + "_first_start"] = (
                min(t.datetime_start.timestamp() for t in study.trials if t.datetime_start) - t0
            )
        result = {"t0": t0, "b_submitted": round(tb - t0, 1), "ends": ends, "rows": rows, "quoted": quoted}
        (out / "result.json").write_text(json.dumps(result, indent=1))
        print(json.dumps({"ends": ends, "b_submitted": result["b_submitted"]}))
        print(quoted.get("status_b", ""))
        print(quoted.get("queue", ""))
    finally:
        for _ in gen:
            pass


if __name__ == "__main__":
    main(Path(sys.argv[1]))
