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
    /// A fresh random (version 4) id.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
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
