"""``python tests/engine/trackio_probe.py PROJECT``: what the trackio store of ``TRACKIO_DIR`` holds
for one project, as JSON on stdout, read through trackio's own Api and store.

It runs in a process of its own because trackio reads ``TRACKIO_DIR`` once, when it is first
imported, and importing TRL (other tests do) imports trackio: the test process's trackio points at
the user's store, not the test's."""
import json
import sys

import trackio
from trackio.sqlite_storage import SQLiteStorage


def project_record(project: str) -> dict:
    """{trackio_dir, runs: [{name, id, config, logs, output, manifests}]}: each run's config, logged
    rows, output artifacts and their manifests ('NAME:vN' -> manifest)."""
    runs = []
    for run in trackio.Api().runs(project):
        output = SQLiteStorage.get_run_artifacts(project, run.name, run.id)["output"]
        runs.append({
            "name": run.name, "id": run.id, "config": run.config,
            "logs": SQLiteStorage.get_logs(project, run.name, run_id=run.id),
            "output": output,
            "manifests": {f"{a['name']}:v{a['version']}": SQLiteStorage.get_artifact_manifest(project, a["name"], f"v{a['version']}")
                          for a in output},
        })
    return {"trackio_dir": str(trackio.utils.TRACKIO_DIR), "runs": runs}


if __name__ == "__main__":
    print(json.dumps(project_record(sys.argv[1]), default=str))
