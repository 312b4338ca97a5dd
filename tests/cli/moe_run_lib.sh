# Shared by the load-balance CLI tests (routing logs, report, route, study). After
# cli_test_lib.sh: `source moe_run_lib.sh` defines
#   py PROGRAM [ARG ...]           runs a python3 program given as a string
#   make_corpus DIR                a tiny two-language corpus (en, de) tokenized into DIR
#   tiny_moe_config FILE DATA      a 2-layer, 4-expert top-1 MoE config (capacity 1.0, so
#                                  tokens drop; aux-loss-free bias on) training 8 steps
py() { /usr/bin/python3 -c "$1" "${@:2}"; }

make_corpus() {
  local out="$1"
  mkdir -p "$tmp/corpus"
  : >"$tmp/corpus/en.txt"
  : >"$tmp/corpus/de.txt"
  for i in $(seq 1 150); do
    printf 'the cat %d sat on the mat and the dog ran away from it\n%%\n' "$i" >>"$tmp/corpus/en.txt"
    printf 'der hund %d lief weit weg und die katze schlief im haus\n\n' "$i" >>"$tmp/corpus/de.txt"
  done
  "$bin" prep --out "$out" --vocab 120 --val-fraction 0.2 --seed 1 \
    "$tmp/corpus/en.txt" "$tmp/corpus/de.txt" >"$tmp/prep.out" 2>&1 ||
    { echo "FAIL: prep: $(cat "$tmp/prep.out")"; exit 1; }
}

tiny_moe_config() {
  cat >"$1" <<YAML
model: {vocab_size: 128, seq_len: 16, d_model: 16, n_layers: 2, n_heads: 2, d_ff: 32}
moe:
  num_experts: 4
  layer_freq: 1
  top_k: 1
  d_expert: 16
  capacity_factor: 1.0
  eval_capacity_factor: 1.0
  aux_loss_coef: 0.01
  z_loss_coef: 0.001
  expert_bias_rate: 0.01
train:
  lr: 0.01
  warmup_steps: 1
  max_steps: 8
  micro_batch_size: 2
  grad_accum: 2
  ordered_grad_accum: true  # layouts are compared with one rank bit for bit
  eval_every: 4
  eval_batches: 2
logging:
  routing_every: 3
data:
  dir: $2
YAML
}
