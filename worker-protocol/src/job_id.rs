//! The job identifier: a UUID that travels as a 16-byte msgpack `bin`.
//!
//! A `bin` of 16 bytes is smaller and cheaper to compare than the 36-character text form, and a
//! worker never needs to read it: it hands each id back next to that job's result.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use uuid::Uuid;

/// One job's identity, from the HTTP edge to the worker and back.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JobId(Uuid);

impl JobId {
    /// A fresh random (version 4) id, from the thread's CSPRNG (rand's `ThreadRng`, seeded and
    /// reseeded from the OS): `Uuid::new_v4` asks the kernel for each one, a `getrandom` call
    /// of ~390 ns against ~26 ns, once per request and per item.
    pub fn new() -> Self {
        Self(uuid::Builder::from_random_bytes(rand::random()).into_uuid())
    }

    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(Uuid::from_bytes(bytes))
    }

    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl Default for JobId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl Serialize for JobId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0.as_bytes())
    }
}

impl<'de> Deserialize<'de> for JobId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_bytes(JobIdVisitor)
    }
}

struct JobIdVisitor;

impl Visitor<'_> for JobIdVisitor {
    type Value = JobId;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a job id: 16 bytes of msgpack bin")
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<JobId, E> {
        let bytes: [u8; 16] = v.try_into().map_err(|_| E::invalid_length(v.len(), &self))?;
        Ok(JobId::from_bytes(bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::JobId;

    #[test]
    fn a_new_id_is_a_random_version_4_uuid_and_never_repeats() {
        let ids: std::collections::HashSet<JobId> = (0..10_000).map(|_| JobId::new()).collect();
        assert_eq!(ids.len(), 10_000);
        for id in ids.iter().take(100) {
            assert_eq!(id.as_uuid().get_version(), Some(uuid::Version::Random));
            assert_eq!(id.as_uuid().get_variant(), uuid::Variant::RFC4122);
        }
        // Each thread has its own generator: ids from two threads differ too.
        let other = std::thread::spawn(JobId::new).join().unwrap();
        assert!(!ids.contains(&other));
    }
}
