//! An entry's key (its group's index, 2 bytes, then the entity's Redis key) held in place:
//! a standard key (`consumer_features` of `c:1234567`: 11 bytes) fits in the 32 bytes
//! the type takes, so a key in the cache's table, in a load's claim or in a lookup's list
//! of misses needs no allocation of its own, and comparing one in the table reads the
//! table's own slot, not a box elsewhere in memory (a lookup of a key not hit lately paid
//! a cache miss there: `benchmarks/l1_misses.py`'s misses). A longer key (string ids of up
//! to 255 bytes) is boxed.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

/// The bytes a key holds in place.
const INLINE: usize = 30;

#[derive(Clone)]
pub enum Key {
    Inline(u8, [u8; INLINE]),
    Boxed(Box<[u8]>),
}

impl Key {
    pub fn new(bytes: &[u8]) -> Self {
        if bytes.len() <= INLINE {
            let mut inline = [0u8; INLINE];
            inline[..bytes.len()].copy_from_slice(bytes);
            Key::Inline(bytes.len() as u8, inline)
        } else {
            Key::Boxed(bytes.into())
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        match self {
            Key::Inline(len, bytes) => &bytes[..usize::from(*len)],
            Key::Boxed(bytes) => bytes,
        }
    }
}

impl From<&[u8]> for Key {
    fn from(bytes: &[u8]) -> Self {
        Key::new(bytes)
    }
}

impl Deref for Key {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

// hashed, compared and ordered as its bytes, so that a map of keys is read with a `&[u8]`
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_slice().hash(state);
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({:?})", self.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;
    use std::collections::HashMap;

    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        let mut hasher = DefaultHasher::new();
        value.hash(&mut hasher);
        hasher.finish()
    }

    /// Short and long keys: their bytes as given, hashed, compared and ordered as those
    /// bytes (so a map of keys is read with a slice), short ones held in place.
    #[test]
    fn a_key_is_its_bytes() {
        let long = vec![7u8; 200];
        let cases: [&[u8]; 5] = [
            b"",
            b"\x00\x01c:1",
            &[1u8; INLINE],
            &[2u8; INLINE + 1],
            &long,
        ];
        for bytes in cases {
            let key = Key::new(bytes);
            assert_eq!(key.as_slice(), bytes);
            assert_eq!(hash_of(&key), hash_of(bytes));
            assert_eq!(matches!(key, Key::Inline(..)), bytes.len() <= INLINE);
            let mut map = HashMap::new();
            map.insert(key.clone(), 1);
            assert_eq!(map.get(bytes), Some(&1));
        }
        let mut keys: Vec<Key> = cases.iter().map(|b| Key::new(b)).collect();
        keys.sort();
        let mut slices: Vec<&[u8]> = cases.to_vec();
        slices.sort();
        assert_eq!(keys.iter().map(Key::as_slice).collect::<Vec<_>>(), slices);
        assert!(std::mem::size_of::<Key>() <= 32);
    }
}
