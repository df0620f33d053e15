//! API keys on the fronts: the rule of `auth.Authenticator.role`, whose Python code stays
//! the reference (a property test holds them equal) and answers again inside the handlers.
//! The roles are Python's (`auth.Role`'s values, handed over with the keys): here a role is
//! only compared, so none is defined twice.

use pyo3::prelude::*;

/// The keys a front checks: each with its role, and the role everyone has where there are
/// no keys (auth off).
pub(crate) struct Keys {
    keys: Vec<(Vec<u8>, u8)>,
    open: u8,
}

impl Keys {
    pub(crate) fn new(keys: Vec<(Vec<u8>, u8)>, open: u8) -> Self {
        Keys { keys, open }
    }

    /// The role an Authorization header grants: `open` for everyone without keys; else
    /// "Bearer <key>" (scheme in any case, the key trimmed) compared with every key in
    /// constant time, the highest role of the keys it equals; None for no key or an
    /// unknown one.
    pub(crate) fn role(&self, authorization: Option<&str>) -> Option<u8> {
        if self.keys.is_empty() {
            return Some(self.open);
        }
        let header = authorization.filter(|h| !h.is_empty())?;
        let (scheme, token) = match header.find(' ') {
            Some(i) => (&header[..i], &header[i + 1..]),
            None => (header, ""),
        };
        if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
            return None;
        }
        let candidate = token.trim().as_bytes();
        let mut role = None;
        for (key, key_role) in &self.keys {
            if equal_in_constant_time(key, candidate) && Some(*key_role) > role {
                role = Some(*key_role);
            }
        }
        role
    }

    /// Whether the header grants `needed` or more.
    pub(crate) fn allows(&self, authorization: Option<&str>, needed: u8) -> bool {
        self.role(authorization)
            .map_or(false, |role| role >= needed)
    }
}

fn equal_in_constant_time(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `Keys::role` for the property tests that hold it to `auth.Authenticator.role`.
#[pyfunction]
#[pyo3(signature = (keys, open, authorization))]
pub fn key_role(keys: Vec<(Vec<u8>, u8)>, open: u8, authorization: Option<&str>) -> Option<u8> {
    Keys::new(keys, open).role(authorization)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles() {
        let keys = Keys::new(vec![(b"r".to_vec(), 1), (b"a".to_vec(), 2)], 2);
        assert_eq!(Keys::new(Vec::new(), 2).role(None), Some(2));
        assert_eq!(keys.role(None), None);
        assert_eq!(keys.role(Some("Bearer r")), Some(1));
        assert_eq!(keys.role(Some("bearer  a ")), Some(2));
        assert_eq!(keys.role(Some("Basic a")), None);
        assert_eq!(keys.role(Some("Bearer")), None);
        assert!(keys.allows(Some("Bearer a"), 1));
        assert!(!keys.allows(Some("Bearer r"), 2));
    }
}
