//! A lookup as the front received it, read narrowly: a REST or Feast JSON body (serde,
//! borrowing its strings) or a `GetFeaturesRequest` message in the forms answered here.
//! Anything else (escapes, unknown fields, mixed ids, a bypass) is Python's.

use std::fmt;
use std::time::Instant;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{FEAST, GRPC, REST};
use crate::codecs::{json_i64, json_str, read_varint};
use crate::rows::GrpcId;

/// A lookup as asked, over REST or gRPC: what its form and its answer need of it.
pub(super) struct Asked<'a> {
    pub(super) api: u8,
    pub(super) started: Instant,
    pub(super) entity: &'a str,
    pub(super) ids: Vec<Id<'a>>,
    pub(super) features: Vec<&'a str>,
    pub(super) groups: Vec<&'a str>,
}

impl<'a> Asked<'a> {
    /// A lookup of `api` as the front received it.
    pub(super) fn parse(api: u8, request: &'a [u8]) -> Option<Self> {
        match api {
            REST => Self::rest(request),
            GRPC => Self::grpc(request),
            FEAST => Self::feast(request),
            _ => None,
        }
    }

    /// A Feast `/get-online-features` body in the form answered here (`FeastBody`). Its
    /// form is its join key, its feature references (or its feature service) and its
    /// flags, which stand in the form's groups, named as the body names them.
    fn feast(body: &'a [u8]) -> Option<Self> {
        let started = Instant::now();
        let request: FeastBody<'a> = serde_json::from_slice(body).ok()?;
        let mut groups = Vec::new();
        let features = match request.service {
            Some(service) => {
                groups.push("feature_service");
                vec![service]
            }
            None => request.features,
        };
        if request.full_feature_names {
            groups.push("full_feature_names");
        }
        if request.with_views {
            groups.push("include_feature_view_version_metadata");
        }
        Some(Asked {
            api: FEAST,
            started,
            entity: request.join_key,
            ids: request.ids,
            features,
            groups,
        })
    }

    /// A `POST /v1/features/get` body in the form answered here; not one that bypasses the
    /// cache (Python checks the key's role).
    fn rest(body: &'a [u8]) -> Option<Self> {
        let started = Instant::now();
        let request: GetBody<'a> = serde_json::from_slice(body).ok()?;
        if request.bypass_cache {
            return None;
        }
        Some(Asked {
            api: REST,
            started,
            entity: request.entity_type,
            ids: request.ids,
            features: request.features,
            groups: request.groups,
        })
    }
}

pub(super) enum Id<'a> {
    Int(i64),
    Str(&'a str),
}

impl Id<'_> {
    /// As JSON: an int's digits, a string quoted (as orjson).
    pub(super) fn json(&self, out: &mut Vec<u8>) {
        match self {
            Id::Int(n) => json_i64(out, *n),
            Id::Str(s) => json_str(out, s),
        }
    }

    pub(super) fn grpc(&self) -> GrpcId<'_> {
        match self {
            Id::Int(n) => GrpcId::Int(*n),
            Id::Str(s) => GrpcId::Str(s),
        }
    }
}

struct GetBody<'a> {
    entity_type: &'a str,
    ids: Vec<Id<'a>>,
    features: Vec<&'a str>,
    groups: Vec<&'a str>,
    bypass_cache: bool,
}

struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a form the front answers")
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Id<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct IdVisitor;
        impl<'de> Visitor<'de> for IdVisitor {
            type Value = Id<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an int64 or a string without escapes")
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Id<'de>, E> {
                Ok(Id::Int(n))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Id<'de>, E> {
                i64::try_from(n)
                    .map(Id::Int)
                    .map_err(|_| E::custom(Refused))
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Id<'de>, E> {
                Ok(Id::Str(s))
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

/// The fields of the fast form, each once; an unknown, repeated or differently typed field
/// (null included), a string with escapes, a number with a fraction: not this form.
impl<'de: 'a, 'a> Deserialize<'de> for GetBody<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BodyVisitor;
        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = GetBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a lookup request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<GetBody<'de>, A::Error> {
                let (mut entity, mut ids, mut features, mut groups, mut bypass) =
                    (None, None, None, None, None);
                while let Some(name) = map.next_key::<&'de str>()? {
                    let fresh = match name {
                        "entity_type" => entity.replace(map.next_value::<&'de str>()?).is_none(),
                        "ids" => ids.replace(map.next_value::<Vec<Id<'de>>>()?).is_none(),
                        "features" => features
                            .replace(map.next_value::<Names<'de>>()?.0)
                            .is_none(),
                        "groups" => groups.replace(map.next_value::<Names<'de>>()?.0).is_none(),
                        "bypass_cache" => bypass.replace(map.next_value::<bool>()?).is_none(),
                        _ => false,
                    };
                    if !fresh {
                        return Err(de::Error::custom(Refused));
                    }
                }
                Ok(GetBody {
                    entity_type: entity.ok_or_else(|| de::Error::custom(Refused))?,
                    ids: ids.ok_or_else(|| de::Error::custom(Refused))?,
                    features: features.unwrap_or_default(),
                    groups: groups.unwrap_or_default(),
                    bypass_cache: bypass.unwrap_or(false),
                })
            }
        }
        d.deserialize_map(BodyVisitor)
    }
}

/// A Feast `/get-online-features` body (`feast_api.parse_read`) in the form answered here:
/// one entity column (its ids as in `GetBody`), the features as `features` (strings
/// without escapes) or `feature_service` (which wins, as in Python), the two flags as
/// booleans, each field once. Other fields are skipped, as Python ignores them.
struct FeastBody<'a> {
    join_key: &'a str,
    ids: Vec<Id<'a>>,
    features: Vec<&'a str>,
    service: Option<&'a str>,
    full_feature_names: bool,
    with_views: bool,
}

impl<'de: 'a, 'a> Deserialize<'de> for FeastBody<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct BodyVisitor;
        impl<'de> Visitor<'de> for BodyVisitor {
            type Value = FeastBody<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Feast lookup request")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FeastBody<'de>, A::Error> {
                let (mut entities, mut features, mut service) = (None, None, None);
                let (mut full, mut views) = (None, None);
                while let Some(name) = map.next_key::<&'de str>()? {
                    let fresh = match name {
                        "entities" => entities.replace(map.next_value::<Column<'de>>()?).is_none(),
                        "features" => features
                            .replace(map.next_value::<Names<'de>>()?.0)
                            .is_none(),
                        "feature_service" => service
                            .replace(map.next_value::<Option<&'de str>>()?)
                            .is_none(),
                        "full_feature_names" => full.replace(map.next_value::<bool>()?).is_none(),
                        "include_feature_view_version_metadata" => {
                            views.replace(map.next_value::<bool>()?).is_none()
                        }
                        _ => {
                            map.next_value::<de::IgnoredAny>()?;
                            true
                        }
                    };
                    if !fresh {
                        return Err(de::Error::custom(Refused));
                    }
                }
                let Column(join_key, ids) = entities.ok_or_else(|| de::Error::custom(Refused))?;
                Ok(FeastBody {
                    join_key,
                    ids,
                    features: features.unwrap_or_default(),
                    service: service.flatten(),
                    full_feature_names: full.unwrap_or(false),
                    with_views: views.unwrap_or(false),
                })
            }
        }
        d.deserialize_map(BodyVisitor)
    }
}

/// Feast's `entities` of one column: its join key and ids.
struct Column<'a>(&'a str, Vec<Id<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Column<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ColumnVisitor;
        impl<'de> Visitor<'de> for ColumnVisitor {
            type Value = Column<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of one join key's ids")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Column<'de>, A::Error> {
                // (a match, not let-else: the crate builds with Rust 1.63)
                let join_key = match map.next_key::<&'de str>()? {
                    Some(join_key) => join_key,
                    None => return Err(de::Error::custom(Refused)),
                };
                let ids = map.next_value::<Vec<Id<'de>>>()?;
                if map.next_key::<&'de str>()?.is_some() {
                    return Err(de::Error::custom(Refused)); // several entities: Python's
                }
                Ok(Column(join_key, ids))
            }
        }
        d.deserialize_map(ColumnVisitor)
    }
}

/// An array of strings without escapes.
struct Names<'a>(Vec<&'a str>);

impl<'de: 'a, 'a> Deserialize<'de> for Names<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NamesVisitor;
        impl<'de> Visitor<'de> for NamesVisitor {
            type Value = Names<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of strings")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Names<'de>, A::Error> {
                let mut names = Vec::new();
                while let Some(name) = seq.next_element::<&'de str>()? {
                    names.push(name);
                }
                Ok(Names(names))
            }
        }
        d.deserialize_seq(NamesVisitor)
    }
}

impl<'a> Asked<'a> {
    /// A `GetFeaturesRequest` (serving.proto) in the form answered here: each field in its
    /// wire type, the entity type once, ids of one kind, strings in UTF-8, no bypass, no
    /// other field. Anything else is Python's, which parses it with protobuf.
    fn grpc(data: &'a [u8]) -> Option<Self> {
        let mut request = Asked {
            api: GRPC,
            started: Instant::now(),
            entity: "",
            ids: Vec::new(),
            features: Vec::new(),
            groups: Vec::new(),
        };
        let (mut entity_seen, mut ints, mut strings) = (false, false, false);
        let mut pos = 0;
        while pos < data.len() {
            let tag = read_varint(data, &mut pos).ok()?;
            match tag {
                0x0A | 0x1A | 0x22 | 0x2A => {
                    let len = read_varint(data, &mut pos).ok()? as usize;
                    let end = pos.checked_add(len).filter(|&e| e <= data.len())?;
                    let text = std::str::from_utf8(&data[pos..end]).ok()?;
                    pos = end;
                    match tag {
                        0x0A if !entity_seen => {
                            entity_seen = true;
                            request.entity = text;
                        }
                        0x1A => {
                            strings = true;
                            request.ids.push(Id::Str(text));
                        }
                        0x22 => request.features.push(text),
                        0x2A => request.groups.push(text),
                        _ => return None,
                    }
                }
                0x12 => {
                    // int_ids, packed
                    let len = read_varint(data, &mut pos).ok()? as usize;
                    let end = pos.checked_add(len).filter(|&e| e <= data.len())?;
                    while pos < end {
                        request
                            .ids
                            .push(Id::Int(read_varint(data, &mut pos).ok()? as i64));
                    }
                    if pos != end {
                        return None;
                    }
                    ints = true;
                }
                0x10 => {
                    // one int_id, unpacked
                    request
                        .ids
                        .push(Id::Int(read_varint(data, &mut pos).ok()? as i64));
                    ints = true;
                }
                0x30 => {
                    if read_varint(data, &mut pos).ok()? != 0 {
                        return None; // bypass_cache: Python checks the key's role
                    }
                }
                _ => return None,
            }
        }
        if ints && strings {
            return None;
        }
        Some(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Option<GetBody<'_>> {
        serde_json::from_str(body).ok()
    }

    #[test]
    fn the_fast_form_only() {
        let b = parse(r#"{"entity_type":"user","ids":[1,-2,"x"],"groups":["g"]}"#).unwrap();
        assert_eq!(b.entity_type, "user");
        assert_eq!(b.ids.len(), 3);
        assert_eq!(b.groups, vec!["g"]);
        assert!(b.features.is_empty() && !b.bypass_cache);
        for refused in [
            r#"{"entity_type":"user"}"#,
            r#"{"entity_type":"user","ids":[1],"feature":["a"]}"#,
            r#"{"entity_type":"user","ids":[1],"ids":[2]}"#,
            r#"{"entity_type":"user","ids":[1.0]}"#,
            r#"{"entity_type":"user","ids":[18446744073709551615]}"#,
            r#"{"entity_type":"us\u0065r","ids":[1]}"#,
            r#"{"entity_type":"user","ids":[1],"features":null}"#,
            r#"[1]"#,
        ] {
            assert!(parse(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn the_feast_form_only() {
        let asked = |body: &'static str| Asked::feast(body.as_bytes());
        let a = asked(
            r#"{"features":["v:a","v:b"],"entities":{"k":[1,2]},"project":{"x":[1,"]"]},
                "full_feature_names":true}"#,
        )
        .unwrap();
        assert_eq!((a.api, a.entity, a.ids.len()), (FEAST, "k", 2));
        assert_eq!(a.features, vec!["v:a", "v:b"]);
        assert_eq!(a.groups, vec!["full_feature_names"]);
        // a service wins over the features, as in Python; a null one is none
        let a = asked(r#"{"features":["v:a"],"feature_service":"s","entities":{"k":["x"]}}"#);
        let a = a.unwrap();
        assert_eq!((a.features, a.groups), (vec!["s"], vec!["feature_service"]));
        let a = asked(r#"{"features":["v:a"],"feature_service":null,"entities":{"k":[1]}}"#);
        assert_eq!(a.unwrap().features, vec!["v:a"]);
        for refused in [
            r#"{"features":["v:a"]}"#,
            r#"{"features":["v:a"],"entities":{}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1],"j":[2]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1]},"entities":{"k":[1]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1.5]}}"#,
            r#"{"features":["v:a"],"entities":{"k":[1]},"full_feature_names":null}"#,
            r#"{"features":["v:\u0061"],"entities":{"k":[1]}}"#,
        ] {
            assert!(asked(refused).is_none(), "{refused}");
        }
    }

    #[test]
    fn the_grpc_form_only() {
        // entity_type "u", int_ids [1, -1] packed, groups ["g"]
        let mut m = vec![0x0A, 1, b'u', 0x12, 11, 1];
        m.extend_from_slice(&[0xFF; 9]);
        m.push(0x01);
        m.extend_from_slice(&[0x2A, 1, b'g']);
        let r = Asked::grpc(&m).unwrap();
        assert_eq!(r.entity, "u");
        assert!(matches!(r.ids[..], [Id::Int(1), Id::Int(-1)]));
        assert_eq!(r.groups, vec!["g"]);
        for refused in [
            vec![0x0A, 1, b'u', 0x0A, 1, b'v'], // entity_type twice
            vec![0x10, 1, 0x1A, 1, b'a'],       // int and string ids
            vec![0x30, 1],                      // bypass_cache
            vec![0x38, 1],                      // an unknown field
            vec![0x0A, 5, b'u'],                // cut short
            vec![0x0A, 1, 0xFF],                // not UTF-8
        ] {
            assert!(Asked::grpc(&refused).is_none(), "{refused:?}");
        }
    }
}
