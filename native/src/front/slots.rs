//! Redis Cluster's hash slots: a key's slot (CRC16 of its hash tag, or of the key, modulo
//! 16,384) and the table of which master owns each slot, as Python hands it over.
//!
//! The reference is Redis's own `CLUSTER KEYSLOT`; `tests/unit/test_cluster_slots.py`
//! asserts equality for random keys, hash tags included.

use pyo3::prelude::*;

/// Hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// A slot no known master owns (the table's entry until Python learns it).
pub(crate) const UNOWNED: u16 = u16::MAX;

/// CRC16/XMODEM (polynomial 0x1021, initial 0), Redis Cluster's key hash.
const fn crc16_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
}

static CRC16: [u16; 256] = crc16_table();

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16[(((crc >> 8) as u8) ^ b) as usize]
    })
}

/// The slot of `key`: of the part between the first `{` and the next `}` when that part
/// is not empty (a hash tag), else of the whole key.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let hashed = match memchr::memchr(b'{', key) {
        Some(open) => match memchr::memchr(b'}', &key[open + 1..]) {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16(hashed) % SLOTS as u16
}

/// The hash slot of `key`, as Redis's `CLUSTER KEYSLOT` computes it.
#[pyfunction]
pub fn key_slot(key: &[u8]) -> u16 {
    slot_of(key)
}
