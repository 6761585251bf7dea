#!/usr/bin/env bash
# Demo-scale kill -9 / resume (issue 31): run `--config demo` with a GRPO preset, kill the whole
# process group with SIGKILL in the middle of iteration 1's GRPO stage (once a mid-stage
# checkpoint of that stage exists and before the stage ends), resume it, and print the walls.
# Compare the finished run with an uninterrupted one by bench/compare_runs.py.
#
#   bench/kill_resume_demo.sh PRESET STORE RUN_ID      e.g. ppo /tmp/kill-ppo kill-ppo
#
# PYTHON (default: python) runs the CLI; NICE (default 10) is the run's niceness.
set -euo pipefail
preset=$1 store=$2 run_id=$3
python=${PYTHON:-python}
kill_iteration=1
progress=$store/checkpoints/$run_id/grpo-progress/iter-$kill_iteration/training_state.json
steps=$($python -c "from flows.config_files import load_config; print(load_config('demo').grpo.steps)")

start=$(date +%s)
setsid nice -n "${NICE:-10}" "$python" -m flows.cli run --config demo \
  --set "grpo.preset=$preset" --no-prefect --store "$store" --run-id "$run_id" \
  >"$store.run.log" 2>&1 &
leader=$!
# The stage writes its progress record atomically after each checkpoint: kill once it says a
# step in the middle of the stage is next (its steps before it are saved, the rest are not).
while kill -0 "$leader" 2>/dev/null; do
  if [[ -f $progress ]]; then
    next_step=$($python -c "import json,sys; print(json.load(open(sys.argv[1]))['next_step'])" "$progress")
    if ((next_step > 0 && next_step < steps)); then
      kill -9 -- "-$leader"
      echo "killed at iteration $kill_iteration, GRPO next_step=$next_step of $steps after $(($(date +%s) - start)) s"
      break
    fi
  fi
  sleep 2
done
wait "$leader" || true
killed=$(date +%s)
grep -q "completed" "$store/runs/$run_id/status.json" && { echo "the run ended before the kill"; exit 1; }
nice -n "${NICE:-10}" "$python" -m flows.cli resume "$run_id" --no-prefect --store "$store" \
  >"$store.resume.log" 2>&1
grep "resuming at step" "$store.resume.log" || true
echo "wall: run until kill $((killed - start)) s, resume $(($(date +%s) - killed)) s"
