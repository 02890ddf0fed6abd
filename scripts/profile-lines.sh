#!/usr/bin/env bash
# Where quorumlock's instructions per acquire+release cycle go, by source line: callgrind
# of the compare bench's quorumlock row (`--count-mode`) for 2,000 and 4,000 cycles on 5
# local redis-server nodes (pinned to CPU 1, the client to CPU 0), built with line tables;
# prints the per-cycle difference per line (setup cancels). Optimised code attributes
# inlined work to approximate lines: read it with `objdump -dl` when a line surprises.
#
# Usage: scripts/profile-lines.sh TAG [REPO_DIR]   (outputs /tmp/cgl.TAG.{2000,4000}.txt)
#        ROW=quorumlock-observed scripts/profile-lines.sh TAG   (another row of the bench)
set -e
cd "${2:-$(dirname "$0")/..}"
export CARGO_PROFILE_BENCH_DEBUG=line-tables-only
cargo bench --bench compare --no-run >/dev/null 2>&1
BIN=$(cargo bench --bench compare --no-run --message-format=json 2>/dev/null | grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep '/compare-' | tail -n1)
DIR=$(mktemp -d)
PORTS=(); PIDS=()
for i in 0 1 2 3 4; do
  p=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
  taskset -c 1 redis-server --port $p --save "" --appendonly no --dir $DIR --daemonize no --logfile $DIR/r$i.log --dbfilename d$i.rdb > /dev/null 2>&1 &
  PIDS+=($!); PORTS+=($p)
done
sleep 1
export COMPARE_PORTS=$(IFS=,; echo "${PORTS[*]}")
for n in 2000 4000; do
  taskset -c 0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cgl.$1.$n "$BIN" --count-mode "${ROW:-quorumlock}" $n > /dev/null 2>&1
done
kill ${PIDS[@]}
rm -rf $DIR
for n in 2000 4000; do callgrind_annotate --auto=yes --show-percs=no --context=0 /tmp/cgl.$1.$n > /tmp/cgl.$1.$n.txt 2>/dev/null; done
python3 - "$1" <<'PY'
import re,sys
tag=sys.argv[1]
def load(f):
    d={}; cur=None
    for line in open(f):
        m=re.match(r'-- Auto-annotated source: (.*)',line)
        if m: cur=m.group(1).strip(); continue
        m=re.match(r'\s*([\d,]+|\.)\s+(\d+)?\s*(.*)',line)
        m2=re.match(r'^\s*([\d,]+)\s+(.*)$',line)
        if cur and m2:
            d.setdefault((cur, m2.group(2)[:90]),0)
            d[(cur,m2.group(2)[:90])]+=int(m2.group(1).replace(',',''))
    return d
a=load(f'/tmp/cgl.{tag}.2000.txt'); b=load(f'/tmp/cgl.{tag}.4000.txt')
rows=[((b.get(k,0)-a.get(k,0))/2000,k) for k in set(a)|set(b)]
rows=[r for r in rows if abs(r[0])>=3]
for v,k in sorted(rows,reverse=True)[:int(__import__("os").environ.get("LINES_SHOWN","70"))]: print(f"{v:7.1f} {k[0].split('/')[-1]:14} {k[1]}")
PY
