//! The wire schema pin (docs/deploy.md §Security, "Wire schema"): the shape of every type koala
//! sends over a socket — control messages, channel messages and the protocols' peer messages
//! inside them, the data connections' first frame, state-server requests and answers, the
//! handshake greeting — reduced to one digest that must equal [`WIRE_SCHEMA_DIGEST`], pinned for
//! the current [`PROTOCOL_VERSION`]. A wire type that changes without a new version fails here,
//! so two builds that would misread each other's frames cannot claim the same version.
//!
//! The shape comes from serde itself (`serde-reflection` traces each type's `Serialize` and
//! `Deserialize`): fields and variants in wire order, with their names (a swapped pair of `u64`
//! fields or of two `{ epoch }` variants reads as the other on an older build) and types, nested
//! types written out in place, so a field changed deep inside `Deployment` changes the digest as
//! much as a new `CoordinatorMessage` variant. Type names are left out: renaming a type changes
//! nothing on the wire. The test lives here, in the lowest crate that sees every wire type.

use std::any::type_name;
use std::collections::BTreeMap;
use std::fmt::Write;

use koala_types::handshake::{PROTOCOL_VERSION, Role, WIRE_SCHEMA_DIGEST, greeting_bytes_of};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_reflection::{
    ContainerFormat, Format, Named, Registry, Samples, Tracer, TracerConfig, VariantFormat,
};

/// A trace in progress: samples recorded first, then the roots (walked into the schema, in
/// order) and the enums nested in them (serde-reflection explores every variant only of the
/// enums it is asked for; its registry refuses, naming it, any other it met).
struct Trace {
    tracer: Tracer,
    samples: Samples,
    roots: Vec<Format>,
}

fn failed(what: &str, e: serde_reflection::Error) -> String {
    format!("tracing {what}: {e} ({})", e.explanation())
}

impl Trace {
    fn new() -> Self {
        let config = TracerConfig::default().record_samples_for_structs(true);
        Self { tracer: Tracer::new(config), samples: Samples::new(), roots: Vec::new() }
    }

    /// Records `value`: a type whose decoding checks its input is then decoded from it.
    fn sample<T: Serialize>(mut self, value: &T) -> Result<Self, String> {
        self.tracer.trace_value(&mut self.samples, value).map_err(|e| failed(type_name::<T>(), e))?;
        Ok(self)
    }

    fn root<T: DeserializeOwned>(mut self) -> Result<Self, String> {
        let (format, _) =
            self.tracer.trace_type::<T>(&self.samples).map_err(|e| failed(type_name::<T>(), e))?;
        self.roots.push(format);
        Ok(self)
    }

    fn nested<T: DeserializeOwned>(mut self) -> Result<Self, String> {
        self.tracer.trace_type::<T>(&self.samples).map_err(|e| failed(type_name::<T>(), e))?;
        Ok(self)
    }

    fn finish(self) -> Result<(Registry, Vec<Format>), String> {
        Ok((self.tracer.registry().map_err(|e| failed("the registry", e))?, self.roots))
    }
}

/// Every wire type's shape, one root per line, then the greeting's layout.
fn wire_schema() -> Result<String, String> {
    use koala_protocol::{control, drrs, koala, memory};
    use koala_state::remote::{StateRequest, StateResponse};
    let (registry, roots) = Trace::new()
        // A filter's blocks are checked when decoded: a real filter of each kind passes.
        .sample(&koala::KeyFilter::build(Vec::new()))?
        .sample(&koala::KeyFilter::build(vec![1, 2, 3]))?
        .root::<control::ControlHello>()?
        .root::<control::ClientReply>()?
        .root::<control::CoordinatorMessage>()?
        .root::<control::WorkerMessage>()?
        .root::<crate::channel::ChannelHello>()?
        .root::<koala_types::ChannelMessage>()?
        .root::<crate::task::KoalaWire>()?
        .root::<crate::task::DrrsWire>()?
        .root::<StateRequest>()?
        .root::<StateResponse>()?
        .nested::<control::ReconfigRequest>()?
        .nested::<control::TaskAck>()?
        .nested::<control::StateBackendKind>()?
        .nested::<control::Protocol>()?
        .nested::<koala::ProtocolError>()?
        .nested::<koala::PeerMessage>()?
        .nested::<koala::InputSource>()?
        .nested::<drrs::DrrsControl>()?
        .nested::<drrs::DrrsPeer>()?
        .nested::<memory::BudgetSource>()?
        .nested::<koala_types::SourcePosition>()?
        .nested::<koala_types::TimeDomain>()?
        .nested::<koala_state::StateWrite>()?
        .finish()?;
    let mut out = shape(&registry, &roots)?;
    // The greeting is laid out by hand (`koala_types::handshake`), not by serde.
    for role in [Role::Worker, Role::Client, Role::Channel, Role::State] {
        let bytes = greeting_bytes_of(0x0102_0304, role, b"token").map_err(|e| e.to_string())?;
        writeln!(out, "greeting {role:?}: {bytes:02x?}").map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The schema's digest: xxh3-64 of its text.
fn digest(schema: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(schema.as_bytes())
}

/// Whether the computed digest is the one pinned for the current version; else the message
/// that says what to do.
fn check(computed: u64, pinned_digest: u64, pinned_version: u32, version: u32) -> Result<(), String> {
    if computed == pinned_digest && pinned_version == version {
        return Ok(());
    }
    Err(format!(
        "the wire schema changed (digest {computed:#018x}, pinned {pinned_digest:#018x} for version \
         {pinned_version}; PROTOCOL_VERSION is {version}): bump PROTOCOL_VERSION and update \
         WIRE_SCHEMA_DIGEST in crates/types/src/handshake.rs to {{ version: <the new version>, \
         digest: {computed:#018x} }}"
    ))
}

/// `roots` written out: one line each, a type's structure in place of its name at its first
/// appearance, `#i` (its order of first appearance) after that.
fn shape(registry: &Registry, roots: &[Format]) -> Result<String, String> {
    let mut writer = ShapeWriter { registry, seen: BTreeMap::new(), out: String::new() };
    for root in roots {
        writer.format(root)?;
        writer.out.push('\n');
    }
    Ok(writer.out)
}

struct ShapeWriter<'a> {
    registry: &'a Registry,
    seen: BTreeMap<String, usize>,
    out: String,
}

impl ShapeWriter<'_> {
    fn format(&mut self, format: &Format) -> Result<(), String> {
        let primitive = match format {
            Format::Variable(_) => return Err("a format left unknown by the trace".into()),
            Format::TypeName(name) => return self.container(name),
            Format::Option(inner) => return self.wrapped("option<", [inner.as_ref()], ">"),
            Format::Seq(inner) => return self.wrapped("seq<", [inner.as_ref()], ">"),
            Format::Map { key, value } => return self.wrapped("map<", [key.as_ref(), value.as_ref()], ">"),
            Format::Tuple(items) => return self.wrapped("(", items, ")"),
            Format::TupleArray { content, size } => {
                self.wrapped("[", [content.as_ref()], "")?;
                self.out.push_str(&format!(";{size}]"));
                return Ok(());
            }
            Format::Unit => "unit",
            Format::Bool => "bool",
            Format::I8 => "i8",
            Format::I16 => "i16",
            Format::I32 => "i32",
            Format::I64 => "i64",
            Format::I128 => "i128",
            Format::U8 => "u8",
            Format::U16 => "u16",
            Format::U32 => "u32",
            Format::U64 => "u64",
            Format::U128 => "u128",
            Format::F32 => "f32",
            Format::F64 => "f64",
            Format::Char => "char",
            Format::Str => "str",
            Format::Bytes => "bytes",
        };
        self.out.push_str(primitive);
        Ok(())
    }

    fn wrapped<'f>(
        &mut self,
        open: &str,
        items: impl IntoIterator<Item = &'f Format>,
        close: &str,
    ) -> Result<(), String> {
        self.out.push_str(open);
        for (i, item) in items.into_iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.format(item)?;
        }
        self.out.push_str(close);
        Ok(())
    }

    fn fields(&mut self, fields: &[Named<Format>]) -> Result<(), String> {
        self.out.push('{');
        for (i, field) in fields.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(&field.name);
            self.out.push(':');
            self.format(&field.value)?;
        }
        self.out.push('}');
        Ok(())
    }

    fn container(&mut self, name: &str) -> Result<(), String> {
        if let Some(i) = self.seen.get(name) {
            self.out.push_str(&format!("#{i}"));
            return Ok(());
        }
        self.seen.insert(name.to_string(), self.seen.len());
        let registry = self.registry;
        match registry.get(name).ok_or_else(|| format!("{name} is not in the registry"))? {
            ContainerFormat::UnitStruct => self.out.push_str("unit-struct"),
            ContainerFormat::NewTypeStruct(inner) => self.wrapped("newtype(", [inner.as_ref()], ")")?,
            ContainerFormat::TupleStruct(items) => self.wrapped("tuple-struct(", items, ")")?,
            ContainerFormat::Struct(fields) => {
                self.out.push_str("struct");
                self.fields(fields)?;
            }
            ContainerFormat::Enum(variants) => {
                self.out.push_str("enum{");
                // Indexed from 0 with no gap: the index is what the encoding carries.
                for (expected, (index, variant)) in variants.iter().enumerate() {
                    if *index as usize != expected {
                        return Err(format!(
                            "{name}: variant {} has index {index}, not {expected}",
                            variant.name
                        ));
                    }
                    if expected > 0 {
                        self.out.push(',');
                    }
                    self.out.push_str(&variant.name);
                    match &variant.value {
                        VariantFormat::Variable(_) => {
                            return Err(format!("{name}::{} left unknown", variant.name));
                        }
                        VariantFormat::Unit => {}
                        VariantFormat::NewType(inner) => self.wrapped("(", [inner.as_ref()], ")")?,
                        VariantFormat::Tuple(items) => self.wrapped("(", items, ")")?,
                        VariantFormat::Struct(fields) => self.fields(fields)?,
                    }
                }
                self.out.push('}');
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    /// The pin: fails, with what to do, when a wire type changed and the version did not.
    #[test]
    fn the_wire_schema_matches_the_pinned_digest() {
        let schema = wire_schema().unwrap_or_else(|e| panic!("{e}"));
        let computed = digest(&schema);
        if let Err(message) =
            check(computed, WIRE_SCHEMA_DIGEST.digest, WIRE_SCHEMA_DIGEST.version, PROTOCOL_VERSION)
        {
            panic!("{message}\n\nthe schema now:\n{schema}");
        }
    }

    #[test]
    fn the_message_names_both_digests_and_what_to_do() {
        assert_eq!(check(7, 7, 3, 3), Ok(()));
        let message = check(8, 7, 3, 3).expect_err("another digest");
        assert!(
            message.starts_with(
                "the wire schema changed (digest 0x0000000000000008, pinned 0x0000000000000007 for version 3"
            ),
            "{message}"
        );
        assert!(message.contains("bump PROTOCOL_VERSION and update WIRE_SCHEMA_DIGEST"), "{message}");
        // A version bumped without its digest pinned again fails too.
        assert!(check(7, 7, 3, 4).is_err());
    }

    mod before {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Inner {
            pub epoch: u64,
            pub bytes: u64,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Message {
            Start,
            Drain { epoch: u64 },
            Resume { epoch: u64 },
            Moved(Vec<Inner>),
        }
    }

    /// A field of a type nested two levels down changed its type.
    mod nested_field {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Inner {
            pub epoch: u64,
            pub bytes: u32,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Message {
            Start,
            Drain { epoch: u64 },
            Resume { epoch: u64 },
            Moved(Vec<Inner>),
        }
    }

    /// Two variants of one shape swapped places: an older build reads one as the other.
    mod swapped_variants {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Inner {
            pub epoch: u64,
            pub bytes: u64,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Message {
            Start,
            Resume { epoch: u64 },
            Drain { epoch: u64 },
            Moved(Vec<Inner>),
        }
    }

    /// Only the nested type's name changed: nothing on the wire did.
    mod renamed_type {
        use super::*;
        #[derive(Serialize, Deserialize)]
        pub struct Moved {
            pub epoch: u64,
            pub bytes: u64,
        }
        #[derive(Serialize, Deserialize)]
        pub enum Message {
            Start,
            Drain { epoch: u64 },
            Resume { epoch: u64 },
            Moved(Vec<Moved>),
        }
    }

    fn shape_of<T: DeserializeOwned>() -> String {
        let (registry, roots) =
            Trace::new().root::<T>().and_then(Trace::finish).unwrap_or_else(|e| panic!("{e}"));
        shape(&registry, &roots).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The test above can fail: a change anywhere in a message's shape changes the digest.
    #[test]
    fn a_change_in_a_nested_type_or_the_variant_order_changes_the_digest() {
        let base = digest(&shape_of::<before::Message>());
        assert_ne!(base, digest(&shape_of::<nested_field::Message>()), "a nested field's type");
        assert_ne!(base, digest(&shape_of::<swapped_variants::Message>()), "the variants' order");
        assert_eq!(base, digest(&shape_of::<renamed_type::Message>()), "a type's name is not on the wire");
        assert_eq!(
            shape_of::<before::Message>(),
            "enum{Start,Drain{epoch:u64},Resume{epoch:u64},Moved(seq<struct{epoch:u64,bytes:u64}>)}\n"
        );
    }
}
