//! A random stream identical to CPython's `random.Random(seed)` for integer seeds: the MT19937
//! generator, `random()`, `getrandbits(k)` for k <= 32 and `shuffle`. The sampler draws from it
//! so that its plans equal, batch for batch, those of the Python sampler it replaces (tested
//! against CPython in `tests/it`).
//!
//! Implemented from the published MT19937 algorithm (Matsumoto and Nishimura, 1998) and CPython's
//! documented seeding (`init_by_array` over the seed's 32-bit little-endian words).

const N: usize = 624;
const M: usize = 397;

/// CPython-compatible Mersenne Twister.
#[derive(Clone)]
pub struct PyRandom {
    mt: Box<[u32; N]>,
    index: usize,
}

impl std::fmt::Debug for PyRandom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PyRandom {{ index: {} }}", self.index)
    }
}

impl PyRandom {
    /// Equivalent to `random.Random(seed)` in Python.
    pub fn new(seed: u64) -> PyRandom {
        // CPython seeds with the absolute value's 32-bit words, least significant first, and
        // always at least one word.
        let key: Vec<u32> = if seed >> 32 == 0 {
            vec![seed as u32]
        } else {
            vec![seed as u32, (seed >> 32) as u32]
        };
        let mut r = PyRandom { mt: Box::new([0; N]), index: N };
        r.init_genrand(19_650_218);
        r.init_by_array(&key);
        r
    }

    fn init_genrand(&mut self, s: u32) {
        self.mt[0] = s;
        for i in 1..N {
            let prev = self.mt[i - 1];
            self.mt[i] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(i as u32);
        }
        self.index = N;
    }

    fn init_by_array(&mut self, key: &[u32]) {
        let mt = &mut self.mt;
        let (mut i, mut j) = (1usize, 0usize);
        for _ in 0..N.max(key.len()) {
            let prev = mt[i - 1];
            mt[i] = (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_664_525))
                .wrapping_add(key[j])
                .wrapping_add(j as u32);
            i += 1;
            j += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
            if j >= key.len() {
                j = 0;
            }
        }
        for _ in 0..N - 1 {
            let prev = mt[i - 1];
            mt[i] =
                (mt[i] ^ (prev ^ (prev >> 30)).wrapping_mul(1_566_083_941)).wrapping_sub(i as u32);
            i += 1;
            if i >= N {
                mt[0] = mt[N - 1];
                i = 1;
            }
        }
        mt[0] = 0x8000_0000;
    }

    fn generate(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7fff_ffff;
        const MATRIX_A: u32 = 0x9908_b0df;
        for k in 0..N {
            let y = (self.mt[k] & UPPER) | (self.mt[(k + 1) % N] & LOWER);
            let mag = if y & 1 == 0 { 0 } else { MATRIX_A };
            self.mt[k] = self.mt[(k + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// The next 32 random bits (`genrand_uint32`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.generate();
        }
        let mut y = self.mt[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }

    /// `random.random()`: uniform in [0, 1) with 53 random bits.
    pub fn random(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67_108_864.0 + b) * (1.0 / 9_007_199_254_740_992.0)
    }

    /// `random.getrandbits(k)` for `1 <= k <= 32`.
    pub fn getrandbits(&mut self, k: u32) -> u32 {
        debug_assert!((1..=32).contains(&k));
        self.next_u32() >> (32 - k)
    }

    /// `random._randbelow(n)` for `1 <= n < 2^32`: rejection sampling on `bit_length(n)` bits.
    pub fn randbelow(&mut self, n: u32) -> u32 {
        let k = 32 - n.leading_zeros();
        loop {
            let r = self.getrandbits(k);
            if r < n {
                return r;
            }
        }
    }

    /// `random.shuffle(x)`: Fisher-Yates from the end, as CPython does it.
    pub fn shuffle<T>(&mut self, x: &mut [T]) {
        for i in (1..x.len()).rev() {
            let j = self.randbelow(i as u32 + 1) as usize;
            x.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by CPython 3.11: `r = random.Random(1234); [r.random() for _ in range(3)]`,
    /// then `[r.getrandbits(7) for _ in range(3)]`, then a shuffle of `range(10)`.
    #[test]
    fn matches_cpython() {
        let mut r = PyRandom::new(1234);
        assert_eq!(
            [r.random(), r.random(), r.random()],
            [0.9664535356921388, 0.4407325991753527, 0.007491470058587191]
        );
        assert_eq!([r.getrandbits(7), r.getrandbits(7), r.getrandbits(7)], [116, 120, 120]);
        let mut x: Vec<u32> = (0..10).collect();
        r.shuffle(&mut x);
        assert_eq!(x, [4, 5, 3, 6, 7, 2, 8, 1, 0, 9]);
        assert_eq!(PyRandom::new((1 << 40) + 5).random(), 0.5043802970418443);
        assert_eq!(PyRandom::new(0).random(), 0.8444218515250481);
    }
}
