#!/usr/bin/env python3
"""The W&B side of `trainer.logger = ["wandb"]`: a worker the trainer starts and feeds.

The trainer writes one JSON line per request on stdin and reads one JSON line per answer:
  (start)                                   -> {"ready": true, "run_dir": ...}
  {"step": k, "metrics": {name: value}}     -> {"ok": true}
  {"images": {name: png_path}, "step": k}   -> {"ok": true}
  end of stdin                              -> wandb.finish(), exit 0
Failures answer {"error": "..."}. The run is offline unless WANDB_MODE says otherwise
(`wandb sync <run>/wandb/offline-run-*` uploads it later). A resumed temper run reuses the
W&B run id kept in <run>/wandb/temper_run_id.

Usage: python tools/wandb_sidecar.py --dir RUN --project P --name N --config CONFIG.json
"""
import argparse
import json
import os
import secrets
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--project", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--config", required=True)
    args = ap.parse_args()
    # Answers go to the original stdout; anything else printed (wandb's own messages) goes to
    # stderr, so it cannot be mistaken for an answer.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def answer(obj):
        answers.write(json.dumps(obj) + "\n")
        answers.flush()

    try:
        import wandb
    except ImportError as e:
        answer({"error": f"trainer.logger = wandb: the wandb package is not installed in {sys.executable} ({e}); scripts/setup-env.sh installs it"})
        return 1
    try:
        with open(args.config) as f:
            config = json.load(f)
        wandb_dir = os.path.join(args.dir, "wandb")
        os.makedirs(wandb_dir, exist_ok=True)
        id_file = os.path.join(wandb_dir, "temper_run_id")
        if os.path.exists(id_file):
            run_id = open(id_file).read().strip()
        else:
            run_id = secrets.token_hex(4)  # W&B run ids: lowercase letters and digits
            with open(id_file + ".tmp", "w") as f:
                f.write(run_id)
            os.replace(id_file + ".tmp", id_file)
        run = wandb.init(
            project=args.project,
            name=args.name,
            id=run_id,
            resume="allow",
            dir=args.dir,
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),
            settings=wandb.Settings(console="off", x_disable_stats=True, disable_git=True, silent=True),
        )
    except Exception as e:  # noqa: BLE001 - any failure to start is reported, then we exit
        answer({"error": f"trainer.logger = wandb: wandb.init failed: {type(e).__name__}: {e}"})
        return 1
    answer({"ready": True, "run_dir": run.dir})
    for line in sys.stdin:
        try:
            req = json.loads(line)
            if "metrics" in req:
                # JSON has no NaN or infinity: the trainer sends them as "NaN", "inf", "-inf".
                metrics = {k: float(v) if isinstance(v, str) else v for k, v in req["metrics"].items()}
                run.log(metrics, step=int(req["step"]))
            elif "images" in req:
                run.log({k: wandb.Image(p) for k, p in req["images"].items()}, step=int(req["step"]))
            else:
                raise ValueError(f"unknown request {sorted(req)}")
            answer({"ok": True})
        except Exception as e:  # noqa: BLE001 - the trainer decides what a failure means
            answer({"error": f"{type(e).__name__}: {e}"})
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
