#!/usr/bin/env bash
# The snarkjs peer of `python -m cuzk_engine bench side-by-side`: the Poseidon-Merkle circuit of
# the snarkjs anchor (one Merkle path of depth D = (2^K - 2) / 242, circomlib Poseidon(2),
# compiled with --O2 for BLS12-381: 16,214 constraints at K = 14, 65,340 at K = 16), its witness
# and its proving key, in $CUZK_SNARKJS_DIR (default ~/.cache/cuzk-snarkjs), outside the repo.
#
#   scripts/snarkjs_peer/prepare.sh 14 16     # once; then, for each K, the peer command is
#   $CUZK_SNARKJS_DIR/node_modules/.bin/snarkjs groth16 prove merkle.zkey merkle.wtns \
#       proof.json public.json        (run in $CUZK_SNARKJS_DIR/kK)
#
# snarkjs 0.7.6, circom2 0.2.23 and circomlib 2.0.5 come from npm (--prefer-offline: a warm
# npm cache is enough). The powers of tau are written by make_ptau.py from a known tau (power
# 17, Lagrange blocks for the K asked), since `powersoftau prepare phase2` alone takes ~48 min
# at power 16 here; the proving key then comes from snarkjs's own `groth16 setup` and `zkey
# contribute`, and a first proof is checked with `groth16 verify`. Needs the project's venv
# (for make_ptau.py) on PATH as `python`.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 K [K...]   (domain 2^K, K < 17)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
dir=${CUZK_SNARKJS_DIR:-$HOME/.cache/cuzk-snarkjs}
mkdir -p "$dir"
cd "$dir"
timed() { local s; s=$(date +%s.%N); "$@"; echo "$(date -u +%T) $(echo "$(date +%s.%N) - $s" | bc) s: $*" >&2; }

[ -f package.json ] || echo '{"name": "cuzk-snarkjs-peer", "private": true}' > package.json
[ -x node_modules/.bin/snarkjs ] || npm install --prefer-offline --no-audit --no-fund \
    snarkjs@0.7.6 circom2@0.2.23 circomlib@2.0.5
snarkjs=$dir/node_modules/.bin/snarkjs

cp "$here/roots.mjs" roots.mjs
node roots.mjs > roots.json
ptau=pot17-k$(IFS=-; echo "$*").ptau  # holds the Lagrange blocks of these K only
[ -f "$ptau" ] || timed python "$here/make_ptau.py" roots.json "$ptau" 17 "$@"

for k in "$@"; do
    depth=$(( (2**k - 2) / 242 ))
    mkdir -p "k$k"
    (
        cd "k$k"
        if [ ! -f merkle.r1cs ]; then
            # circom2 runs as WebAssembly and sees only the working tree: copy the includes in
            rm -rf circomlib && mkdir circomlib && cp -r ../node_modules/circomlib/circuits circomlib/
            sed "s/DEPTH/$depth/" "$here/merkle.circom.in" > merkle.circom
            timed npx --offline circom2 merkle.circom --r1cs --wasm --O2 -p bls12381
        fi
        python3 - "$depth" > input.json <<'PY'
import json, random, sys
depth = int(sys.argv[1])
rnd = random.Random(7)
print(json.dumps({"leaf": str(rnd.getrandbits(200)),
                  "sib": [str(rnd.getrandbits(200)) for _ in range(depth)],
                  "bits": [str(rnd.getrandbits(1)) for _ in range(depth)]}))
PY
        timed node merkle_js/generate_witness.js merkle_js/merkle.wasm input.json merkle.wtns
        "$snarkjs" r1cs info merkle.r1cs | grep -i constraints
        [ -f merkle_0000.zkey ] || timed "$snarkjs" groth16 setup merkle.r1cs "../$ptau" merkle_0000.zkey
        [ -f merkle.zkey ] || timed "$snarkjs" zkey contribute merkle_0000.zkey merkle.zkey \
            --name=peer -e="cuzk side-by-side peer"
        "$snarkjs" zkey export verificationkey merkle.zkey vk.json
        timed "$snarkjs" groth16 prove merkle.zkey merkle.wtns proof.json public.json
        "$snarkjs" groth16 verify vk.json public.json proof.json
    )
done
