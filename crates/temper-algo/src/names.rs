//! Config-facing names: every enum of this crate is parsed from verl's spelling (plus explicit
//! aliases), prints its canonical name, and (de)serialises as that string. An unknown name is an
//! error that lists every known one.

use std::fmt;

/// A config string that names none of the known variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    /// What was being named, e.g. `loss_agg_mode`.
    pub what: &'static str,
    /// The string that was given.
    pub got: String,
    /// Every accepted spelling, canonical names first.
    pub known: Vec<&'static str>,
}

impl UnknownName {
    /// The known name closest to what was given, when it is close enough to be a typo (at most
    /// a third of its letters, and at least one, differ).
    pub fn closest(&self) -> Option<&'static str> {
        let (best, distance) = self
            .known
            .iter()
            .map(|k| (*k, strsim::levenshtein(k, &self.got)))
            .min_by_key(|(_, d)| *d)?;
        (distance <= (self.got.chars().count() / 3).max(1)).then_some(best)
    }
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown {} {:?}", self.what, self.got)?;
        if let Some(c) = self.closest() {
            write!(f, " (did you mean `{c}`?)")?;
        }
        write!(f, "; known: {}", self.known.join(", "))
    }
}

impl std::error::Error for UnknownName {}

/// Defines a fieldless enum with a canonical name and aliases per variant, plus `FromStr`,
/// `Display`, `Serialize` and `Deserialize` through those names (the crate using it needs
/// `serde`). Every config choice of temper is one of these, parsed when the config loads.
#[macro_export]
macro_rules! named_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $var:ident => $canon:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $var ),+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];

            /// The canonical (verl) name.
            pub fn name(self) -> &'static str {
                match self { $($name::$var => $canon),+ }
            }

            /// Every accepted spelling: canonical names first, then aliases.
            pub fn known_names() -> Vec<&'static str> {
                let canonical = [$($canon),+];
                let aliases: &[&'static str] = &[$($($alias,)*)+];
                canonical.iter().chain(aliases).copied().collect()
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::names::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $canon $(| $alias)* => Ok($name::$var), )+
                    _ => Err($crate::names::UnknownName {
                        what: $what,
                        got: s.to_string(),
                        known: Self::known_names(),
                    }),
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl ::serde::Serialize for $name {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $name {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = <String as ::serde::Deserialize>::deserialize(d)?;
                s.parse().map_err(::serde::de::Error::custom)
            }
        }
    };
}

pub use crate::named_enum;
