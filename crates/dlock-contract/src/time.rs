//! Clock fields on the wire are RFC 3339 UTC with milliseconds (C3 §3.1).

use chrono::{DateTime, SecondsFormat, Utc};

/// `t` truncated to whole milliseconds: every instant paydb stores, so PostgreSQL
/// (microseconds), SQLite (text) and memory agree exactly, and text order is time order.
pub fn truncate_ms(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(t.timestamp_millis()).unwrap_or(t)
}

/// Formats a wall-clock instant as `2026-11-30T11:05:30.123Z`.
pub fn rfc3339_ms(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Serde adapter: `#[serde(with = "dlock_contract::time::ms")]`.
pub mod ms {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::rfc3339_ms(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let raw = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&raw).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }
}

/// Serde adapter for optional instants.
pub mod ms_opt {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<DateTime<Utc>>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&super::rfc3339_ms(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<DateTime<Utc>>, D::Error> {
        let raw = Option::<String>::deserialize(d)?;
        raw.map(|r| DateTime::parse_from_rfc3339(&r).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn wall_clock_fields_are_utc_with_milliseconds() {
        let t = Utc.timestamp_millis_opt(1_764_500_730_123).single().expect("valid");
        assert_eq!(rfc3339_ms(t), "2025-11-30T11:05:30.123Z");
    }
}
