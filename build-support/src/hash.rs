//! A stable 128-bit content hash (FNV-1a) for cache keys: no dependency, the same on every
//! platform and Rust version (std's `DefaultHasher` promises neither).

const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
const PRIME: u128 = 0x0000000001000000000000000000013b;

/// Hashes a sequence of fields; each field is length-prefixed so that ("ab", "c") and
/// ("a", "bc") differ.
#[derive(Clone, Debug)]
pub struct KeyHasher(u128);

impl Default for KeyHasher {
    fn default() -> Self {
        KeyHasher(OFFSET)
    }
}

impl KeyHasher {
    fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Adds one field.
    pub fn field(&mut self, data: &[u8]) -> &mut Self {
        self.bytes(&(data.len() as u64).to_le_bytes());
        self.bytes(data);
        self
    }

    /// Adds one string field.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.field(s.as_bytes())
    }

    /// The key as 32 lowercase hex digits.
    pub fn hex(&self) -> String {
        format!("{:032x}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_separated_and_the_value_is_stable() {
        let a = KeyHasher::default().str("ab").str("c").hex();
        let b = KeyHasher::default().str("a").str("bc").hex();
        assert_ne!(a, b);
        // Pinned: a change here invalidates every user's kernel cache.
        assert_eq!(KeyHasher::default().hex(), "6c62272e07bb014262b821756295c58d");
        assert_eq!(a, KeyHasher::default().str("ab").str("c").hex());
    }
}
