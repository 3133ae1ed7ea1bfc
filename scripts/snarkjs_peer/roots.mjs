// Prints ffjavascript's roots of unity for BLS12-381 Fr (Fr.w[k], k = 1..18) as JSON, after
// checking the convention make_ptau.py relies on: snarkjs's Lagrange block k is the inverse FFT
// of [tau^j] with omega = Fr.w[k], i.e. L_i(tau) in natural order (checked here for k = 3).
import { getCurveFromName } from "ffjavascript";

const curve = await getCurveFromName("bls12381");
const Fr = curve.Fr;
const n = 8;
const tau = Fr.e(12345);
const powers = new Uint8Array(n * Fr.n8);
let t = Fr.one;
for (let j = 0; j < n; j++) {
    powers.set(t, j * Fr.n8);
    t = Fr.mul(t, tau);
}
const lagrange = await Fr.ifft(powers);
const w = Fr.w[3];
const zn = Fr.div(Fr.sub(Fr.exp(tau, n), Fr.one), Fr.e(n));
let wi = Fr.one;
for (let i = 0; i < n; i++) {
    const expected = Fr.div(Fr.mul(zn, wi), Fr.sub(tau, wi));
    if (!Fr.eq(expected, lagrange.slice(i * Fr.n8, (i + 1) * Fr.n8))) {
        throw new Error(`ifft convention differs at ${i}`);
    }
    wi = Fr.mul(wi, w);
}
const roots = {};
for (let k = 1; k <= 18; k++) roots[k] = Fr.toString(Fr.w[k]);
console.log(JSON.stringify(roots));
await curve.terminate();
