#!/usr/bin/env bash
# Ranks on two hosts give the single rank's tokens. The two hosts are two network namespaces
# joined by a veth pair (10.231.0.1 and 10.231.0.2, addresses of this test only); mpirun runs in
# the first and starts the second host's daemon through a launcher agent that enters the other
# namespace (where a cluster would use ssh). MPI talks TCP only (no shared-memory transport), and
# the test checks that the ranks' traffic crossed the veth link.
# Usage: two_hosts_test.sh DEEPINFER_BINARY
# Exits 77 (skipped, with the reason printed) where the machine forbids network namespaces.
set -euo pipefail
BIN=$(realpath "$1")
WORK=$(mktemp -d)
NS_A=di_host_a_$$
NS_B=di_host_b_$$
cleanup() {
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
export DEEPINFER_CACHE=${DEEPINFER_CACHE:-$WORK/cache}

skip() {
  echo "SKIPPED: $*"
  exit 77
}
command -v mpirun >/dev/null || skip "mpirun is not installed"
command -v ip >/dev/null || skip "the ip command (iproute2) is not installed"
ip netns add "$NS_A" 2>"$WORK/err" || skip "cannot create network namespaces: $(cat "$WORK/err")"
ip netns add "$NS_B"
# veth names are at most 15 bytes.
VA=diva$$
VB=divb$$
ip link add "${VA:0:15}" type veth peer name "${VB:0:15}" 2>"$WORK/err" ||
  skip "cannot create a veth pair: $(cat "$WORK/err")"
VA=${VA:0:15}
VB=${VB:0:15}
ip link set "$VA" netns "$NS_A"
ip link set "$VB" netns "$NS_B"
ip -n "$NS_A" addr add 10.231.0.1/24 dev "$VA"
ip -n "$NS_B" addr add 10.231.0.2/24 dev "$VB"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$VA" up
ip -n "$NS_B" link set "$VB" up

# The launcher agent: mpirun calls it as `agent HOST COMMAND...`, as it would call ssh.
cat >"$WORK/agent" <<EOF
#!/bin/sh
host=\$1
shift
case "\$host" in
  10.231.0.1) ns=$NS_A ;;
  10.231.0.2) ns=$NS_B ;;
  *) echo "agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod +x "$WORK/agent"
printf '10.231.0.1 slots=2\n10.231.0.2 slots=2\n' >"$WORK/hosts"

tx_bytes() { ip netns exec "$NS_A" cat "/sys/class/net/$VA/statistics/tx_bytes"; }

ARGS=(--num-prompts 4 --input-len 40 --max-tokens 8 --temperature 0 --dtype fp32 --block-size 8
      --logprobs 2)
MODEL=$WORK/tiny
"$BIN" make-tiny --out "$MODEL" --preset tiny >/dev/null
"$BIN" generate --model "$MODEL" "${ARGS[@]}" --output "$WORK/single.jsonl" 2>/dev/null

# ranks:flags; --map-by node puts ranks 0, 2 on the first host and 1, 3 on the second.
for c in "2:--ep 2" "2:--cp 2 --ep 2" "4:--cp 4 --ep 4"; do
  np=${c%%:*}
  rm -f "$WORK/ranks.jsonl"
  before=$(tx_bytes)
  # shellcheck disable=SC2086
  if ! ip netns exec "$NS_A" timeout 300 mpirun --allow-run-as-root -np "$np" \
    --hostfile "$WORK/hosts" --map-by node --mca plm_rsh_agent "$WORK/agent" \
    --mca btl tcp,self --mca pml ob1 --mca btl_tcp_if_include 10.231.0.0/24 \
    --mca oob_tcp_if_include 10.231.0.0/24 -x DEEPINFER_CACHE \
    "$BIN" generate --model "$MODEL" "${ARGS[@]}" ${c#*:} --output "$WORK/ranks.jsonl" \
    2>"$WORK/err"; then
    cat "$WORK/err"
    echo "FAIL: two hosts, $c: the run failed"
    exit 1
  fi
  sent=$(($(tx_bytes) - before))
  grep -q "$np ranks (mpi)" "$WORK/err" || { cat "$WORK/err"; echo "FAIL: $c: not $np MPI ranks"; exit 1; }
  # Every step's collectives cross the link: far more than the daemons' own messages.
  if [ "$sent" -lt 100000 ]; then
    echo "FAIL: two hosts, $c: only $sent bytes crossed the link between the hosts"
    exit 1
  fi
  if ! cmp -s "$WORK/single.jsonl" "$WORK/ranks.jsonl"; then
    echo "FAIL: two hosts, $c differs from the single rank"
    cat "$WORK/err"
    diff <(head -c 2000 "$WORK/single.jsonl") <(head -c 2000 "$WORK/ranks.jsonl") || true
    exit 1
  fi
  echo "ok: two hosts, $c ($sent bytes from host a to host b)"
done
