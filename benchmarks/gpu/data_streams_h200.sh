#!/bin/bash
# Issue 28, item 4 on the lent GPU machine: one large file from the head to one node on loopback (about 4 minutes).
#   1. benchmarks/tls_ceiling.py: plain Python TLS, a thread a connection, client and server in one process;
#   2. benchmarks/data_streams.py on the bulk port, this tree's code (the node's relay processes);
#   3. where OLD names a tarball of an older commit (`git archive --format=tar.gz -o .whl/old/old.tgz <commit>`,
#      carried as .whl/old), the same benchmark on that code in the same call, for an A/B on one machine.
# Two calls before it staged .whl/gpu/c1 and c2 in /tmp/parts; this one carries .whl/gpu/c3 (benchmarks/gpu/stage.sh).
# Env: MIB (default 2048), STREAMS (default "1 2 4 8"), READS (default "whole in-order"). Writes under $OUT.
. benchmarks/gpu/stage.sh >/dev/null || exit 3
MIB=${MIB:-2048} STREAMS=${STREAMS:-1 2 4 8} READS=${READS:-whole in-order}
{ nproc; nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import ssl; print(ssl.OPENSSL_VERSION)"; } \
  | tee $OUT/device.txt
timeout 150 python3 benchmarks/tls_ceiling.py --mib $MIB --connections $STREAMS 2>&1 | tee $OUT/tls_ceiling.txt
ARGS="--mib $MIB --lanes 8 --repeat 2 --ports bulk --streams $STREAMS --reads $READS"
timeout 200 python3 benchmarks/data_streams.py $ARGS 2>&1 | tail -16 | tee $OUT/streams.txt
if [ -n "$OLD" ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && tar xzf "$OLD" -C /tmp/old && cp benchmarks/data_streams.py /tmp/old/benchmarks/
  (cd /tmp/old && PYTHONPATH=/tmp/site:/tmp/old:/tmp/old/agents timeout 200 python3 benchmarks/data_streams.py $ARGS) \
    2>&1 | tail -16 | tee $OUT/streams-old.txt
fi
