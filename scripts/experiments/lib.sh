# Shared by scripts/experiments/*.sh (docs/experiments/README.md). An experiment script
# sources this file with its own arguments, defines its settings for $exp_grid, and calls
#   exp_run --name NAME --title TITLE --setting "NAME=k=v k=v" ... [runner flags] "$@"
# The flags every experiment takes (checked by runner.py, one error line each):
#   --grid full|ci     full: the experiment as docs/experiments/NAME.md describes it (the
#                      default); ci: a few steps of a tiny model, one seed (the bench test);
#                      some experiments name more (moe_vs_dense: pre, v1)
#   --out DIR          where runs, summary.md/.json, figures and report.html go
#                      (default runs/experiments/NAME, or NAME-ci)
#   --data DIR         a `switchyard prep` corpus (default data/code-v2048, which
#                      `python3 scripts/make_code_corpus.py --out data/code-v2048 --vocab 2048`
#                      builds; the ci grid: data/fortunes; the v1 grids: data/code)
#   --seeds N|LIST     3 means seeds 1,2,3; 1,5,9 is a list (default: the experiment's)
#   --steps N          training steps per run (default: the experiment's)
#   --jobs N           runs trained at once, each on cores/N compute threads (default 2)
#   --config FILE      another base config (default configs/experiments/base.yaml, ci.yaml)
#   --bin PATH         the switchyard binary (default build/bin/switchyard)
#   --set k=v          an override applied to every run (repeatable)
#   --power-effects E,E  effects (nats of Δ val loss) summary.md sizes seed counts for
#                      (80% power at alpha 0.05; default 0.005,0.01,0.02)
#   --restore FILE     first unpack a runs archive (runs_archive.py; a published
#                      runs.tar.xz) into --out: its runs count as done
#   --publish DIR      at the end, copy the evidence and runs.tar.xz into DIR (publish.py)
# Finished runs in --out are kept, so a stopped experiment resumes when run again; a kept run
# trained with other steps, data or base config stops it (run.json records them).
exp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
exp_grid=full
exp_args=("$@")
for ((exp_i = 0; exp_i < ${#exp_args[@]}; exp_i++)); do
  case "${exp_args[exp_i]}" in
    --grid) exp_grid="${exp_args[exp_i + 1]-}" ;;
    --grid=*) exp_grid="${exp_args[exp_i]#--grid=}" ;;
    -h|--help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      sed -n '/^# The flags every/,/^[^#]/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
      exit 0 ;;
  esac
done
# A script may name more grids before sourcing this file (exp_more_grids="pre v1"): they
# run on the full grid's config and corpus unless the script sets exp_config / exp_data.
exp_grids="full ci${exp_more_grids:+ $exp_more_grids}"
case " $exp_grids " in
  *" $exp_grid "*) ;;
  *) echo "$(basename "$0"): error: --grid '$exp_grid' is not one of ${exp_grids// /, }" >&2; exit 2 ;;
esac
if [ "$exp_grid" = ci ]; then
  exp_config="$exp_root/configs/experiments/ci.yaml"; exp_data=data/fortunes
else
  # The code corpus at vocabulary 2048 (the head 22% of a token's FLOPs, not 53% as at
  # data/code's 8192: steps about 40% cheaper). The first runs' grids (v1) used data/code.
  exp_config="$exp_root/configs/experiments/base.yaml"; exp_data=data/code-v2048
fi

exp_run() {
  SY_EXPERIMENT_PROG="$(basename "$0")" exec /usr/bin/python3 "$exp_root/scripts/experiments/runner.py" \
    --config "$exp_config" --default-data "$exp_data" --grids "${exp_grids// /,}" "$@"
}
