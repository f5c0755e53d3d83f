//! The schema components of `/openapi.json`. Each stage's workers name the components their
//! schemas refer to as they like, but the document has one namespace: a name two stages declare
//! with different schemas once made one route's request refer to another route's type (the last
//! stage's won), and a worker's `Error` was replaced by Corral's own (the error body).
//!
//! So a name is shared as it is only where every stage that declares it declares the same schema
//! (and none of Corral's own components has it); otherwise each stage's gets the stage's name as
//! a prefix (`scale.Item`, then `scale.Item.2` if a worker took that too), and that stage's
//! `$ref`s — in its request and response schemas and in its other components — are rewritten to
//! match. A schema that refers to a name renamed apart is renamed apart too: two stages' `Pair`
//! may read the same yet mean different `Item`s.
//!
//! A name OpenAPI does not allow as a component's key (anything but `^[a-zA-Z0-9._-]+$`, such as
//! `Page[Item]` or `my item`) made the whole document invalid. It is respelled here, each such
//! character as `_` (`Page_Item_`, as msgspec and pydantic spell a generic's name themselves),
//! with the stage's `$ref`s rewritten like a prefixed name's; rather than the worker refused in
//! its hello: the schemas are documentation (a worker's schema that does not parse is ignored,
//! not refused, too), and a serving model must not go down over the spelling of a type's name.
//! msgspec, which the Python package uses, already writes only allowed names: this is for
//! workers written otherwise.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::{Map, Value};

use crate::stage::weight::unescape;
use crate::stage::Declared;

/// Where a `$ref` into the components points.
const PREFIX: &str = "#/components/schemas/";

/// One stage's request and response schemas, their `$ref`s pointing at the names the document
/// gives the stage's components.
pub struct Schemas {
    pub input: Option<Value>,
    pub output: Option<Value>,
    /// `output` is each chunk of a stream ([`Declared::chunks`]).
    pub chunks: bool,
}

/// Every stage's components under names unique in the document, and each stage's schemas.
pub struct Named {
    pub components: Map<String, Value>,
    /// By stage name.
    pub stages: HashMap<String, Schemas>,
}

/// Names the components of `stages` (each a stage's name and its declarations; names made apart
/// are given out in this order), leaving `own` — the names of Corral's own components — free.
pub fn name<'a>(stages: impl IntoIterator<Item = (&'a str, &'a Declared)>, own: &[&str]) -> Named {
    let stages: Vec<(&str, &Declared)> = stages.into_iter().collect();
    let apart = apart(&stages, own);
    let kept = |name: &&String| !apart.contains(name.as_str()) && allowed(name);
    // Names kept as they are, then Corral's own: neither may be given out again.
    let mut taken = Taken::new(
        stages
            .iter()
            .flat_map(|(_, declared)| declared.components.keys())
            .filter(kept)
            .cloned()
            .chain(own.iter().map(|name| name.to_string())),
    );
    // Names shared (or declared once) but not allowed: respelled once for every stage that
    // declares them, so that they stay shared.
    let mut respelled: HashMap<&str, String> = HashMap::new();
    for name in stages.iter().flat_map(|(_, declared)| declared.components.keys()) {
        if !apart.contains(name.as_str()) && !allowed(name) {
            let new = || taken.unique(allowed_spelling(name));
            respelled.entry(name.as_str()).or_insert_with(new);
        }
    }
    let mut named = Named { components: Map::new(), stages: HashMap::new() };
    for (stage, declared) in &stages {
        let renamed: HashMap<&str, String> = declared
            .components
            .keys()
            .filter_map(|name| {
                let new = if apart.contains(name.as_str()) {
                    taken.unique(allowed_spelling(&format!("{stage}.{name}")))
                } else {
                    respelled.get(name.as_str())?.clone()
                };
                Some((name.as_str(), new))
            })
            .collect();
        let retarget = |schema: &Value| {
            let mut schema = schema.clone();
            if renamed.is_empty() {
                // Nothing to rewrite: a schema of megabytes is not walked for nothing.
                return schema;
            }
            each_ref(&mut schema, &mut |reference| {
                let Some((names, rest)) = target(reference) else { return };
                // The name decoded, or as written where only that is one of the stage's (a
                // name with a literal `%`).
                let known = |name: &&String| declared.components.contains_key(name.as_str());
                let name = names.iter().find(known).unwrap_or(&names[0]);
                // A new name holds only OpenAPI's allowed characters: nothing to escape.
                if let Some(new) = renamed.get(name.as_str()) {
                    *reference = format!("{PREFIX}{new}{rest}");
                }
            });
            schema
        };
        for (name, schema) in &declared.components {
            let name = renamed.get(name.as_str()).unwrap_or(name);
            // A shared name's schema is the same from every stage that declares it.
            named.components.entry(name.clone()).or_insert_with(|| retarget(schema));
        }
        let schemas = Schemas {
            input: declared.input.as_ref().map(retarget),
            output: declared.output.as_ref().map(retarget),
            chunks: declared.chunks,
        };
        named.stages.insert(stage.to_string(), schemas);
    }
    named
}

/// The names that cannot be shared: Corral's own, those two stages declare differently, and
/// those two stages declare alike but whose schema in some stage refers to a name of that stage
/// that cannot be shared (and so on, along any chain of such references).
///
/// One pass over the references turned around: each name kept apart is visited once and keeps
/// apart every shared name that refers to it. Rounds until nothing changed, as this was first
/// written, took a round per link of a chain, each over every reference: two stages' 4,000-long
/// chains took 1 s (14 s in a debug build), in the handler, under the document's lock.
fn apart<'a>(stages: &[(&'a str, &'a Declared)], own: &[&str]) -> HashSet<&'a str> {
    let mut declarers: HashMap<&str, Vec<&Value>> = HashMap::new();
    for (_, declared) in stages {
        for (name, schema) in &declared.components {
            declarers.entry(name.as_str()).or_default().push(schema);
        }
    }
    let mut apart: HashSet<&str> = declarers
        .iter()
        .filter(|(name, schemas)| {
            own.contains(name) || schemas.iter().any(|schema| *schema != schemas[0])
        })
        .map(|(name, _)| *name)
        .collect();
    // For each name, the shared names that refer to it in a stage that declares both: only a
    // shared name can be made apart by what it refers to (one declared once is kept, or
    // respelled, as it is), and only by a name of its own stage.
    let mut referrers: HashMap<String, Vec<&str>> = HashMap::new();
    for (_, declared) in stages {
        for (name, schema) in &declared.components {
            if declarers[name.as_str()].len() > 1 {
                for to in referred(schema) {
                    if declared.components.contains_key(&to) {
                        referrers.entry(to).or_default().push(name.as_str());
                    }
                }
            }
        }
    }
    let mut pending: Vec<&str> = apart.iter().copied().collect();
    while let Some(name) = pending.pop() {
        for &referrer in referrers.get(name).into_iter().flatten() {
            if apart.insert(referrer) {
                pending.push(referrer);
            }
        }
    }
    apart
}

/// The component names `schema` refers to.
fn referred(schema: &Value) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    each_ref(&mut schema.clone(), &mut |reference| {
        names.extend(target(reference).into_iter().flat_map(|(names, _)| names));
    });
    names
}

/// The names given out so far, and for each name wanted that was taken, the suffix to try next.
/// A name is never given back, so a suffix found taken stays taken: each is tried once, not once
/// for every name that respells alike (probing from `.2` each time, one stage's 4,000 names
/// respelled `N_` took 0.5 s; 3 s in a debug build).
struct Taken {
    names: HashSet<String>,
    next: HashMap<String, u64>,
}

impl Taken {
    fn new(names: impl IntoIterator<Item = String>) -> Self {
        Self { names: names.into_iter().collect(), next: HashMap::new() }
    }

    /// `wanted`, or if it is taken, the first of `wanted.2`, `wanted.3`, … that is not; now
    /// taken.
    fn unique(&mut self, wanted: String) -> String {
        let name = if self.names.contains(&wanted) {
            let next = self.next.entry(wanted.clone()).or_insert(2);
            loop {
                let name = format!("{wanted}.{next}");
                *next += 1;
                if !self.names.contains(&name) {
                    break name;
                }
            }
        } else {
            wanted
        };
        self.names.insert(name.clone());
        name
    }
}

/// Whether OpenAPI allows `c` in a component's key: `^[a-zA-Z0-9._-]+$`.
fn allowed_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether OpenAPI allows `name` as a component's key.
fn allowed(name: &str) -> bool {
    !name.is_empty() && name.chars().all(allowed_char)
}

/// `name` with each character OpenAPI does not allow in a component's key as `_` (`_` for an
/// empty name).
fn allowed_spelling(name: &str) -> String {
    if name.is_empty() {
        return "_".into();
    }
    name.chars().map(|c| if allowed_char(c) { c } else { '_' }).collect()
}

/// The component a `$ref` names, and what follows it (a pointer further into that component, or
/// nothing); None for a `$ref` elsewhere. Its JSON Pointer segment unescaped (`~1`, `~0`) two
/// ways: with a URI fragment's percent escapes decoded, as a name OpenAPI does not allow may be
/// written (`Page%5BItem%5D`), and as written (a name with a literal `%`, `a%2Fb`).
fn target(reference: &str) -> Option<([String; 2], &str)> {
    let rest = reference.strip_prefix(PREFIX)?;
    let end = rest.find('/').unwrap_or(rest.len());
    let decoded = percent_encoding::percent_decode_str(&rest[..end]).decode_utf8_lossy();
    Some(([unescape(&decoded), unescape(&rest[..end])], &rest[end..]))
}

/// What a URI fragment's segment must escape beyond a JSON Pointer's `~0` and `~1`: all but
/// letters, digits and the characters OpenAPI allows in a component's name.
const FRAGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'.').remove(b'_').remove(b'-').remove(b'~');

/// A discriminator mapping's bare schema name (OpenAPI allows one there) as the full reference
/// it stands for, so that a renamed name is followed: left bare, it would name nothing.
fn as_reference(reference: &mut String) {
    if !reference.starts_with('#') && !reference.contains('/') {
        let segment = escape(reference);
        let segment = percent_encoding::utf8_percent_encode(&segment, FRAGMENT);
        *reference = format!("{PREFIX}{segment}");
    }
}

/// A name as a JSON Pointer segment.
fn escape(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

/// Calls `visit` on every reference in `schema`: each `$ref`, and each target of an OpenAPI
/// discriminator's `mapping` (msgspec writes one for a tagged union). Values that are data, not
/// schemas (`const`, `enum`, `default`, examples), are left alone, and the keys of a map of
/// named schemas (`properties`, …) are names: a property may be called `$ref` or `enum`.
fn each_ref(schema: &mut Value, visit: &mut dyn FnMut(&mut String)) {
    match schema {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                match (key.as_str(), value) {
                    ("$ref", Value::String(reference)) => visit(reference),
                    ("discriminator", Value::Object(discriminator)) => {
                        let Some(Value::Object(mapping)) = discriminator.get_mut("mapping") else {
                            continue;
                        };
                        for target in mapping.values_mut() {
                            if let Value::String(reference) = target {
                                as_reference(reference);
                                visit(reference);
                            }
                        }
                    }
                    ("const" | "enum" | "default" | "examples" | "example", _) => {}
                    (
                        "properties" | "patternProperties" | "$defs" | "definitions"
                        | "dependentSchemas",
                        Value::Object(named),
                    ) => named.values_mut().for_each(|schema| each_ref(schema, visit)),
                    (_, value) => each_ref(value, visit),
                }
            }
        }
        Value::Array(schemas) => schemas.iter_mut().for_each(|schema| each_ref(schema, visit)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A stage's declarations: `input` as its request schema, and these components.
    fn declared(input: Value, components: Value) -> Declared {
        let Value::Object(components) = components else { panic!("components are a map") };
        Declared { input: Some(input), components, ..Declared::default() }
    }

    fn to(name: &str) -> Value {
        json!({"$ref": format!("{PREFIX}{name}")})
    }

    /// [`apart`] as it was first written, rounds until nothing changes: quadratic on long chains,
    /// but plainly the definition, so the one pass is checked against it.
    fn apart_by_rounds<'a>(stages: &[(&'a str, &'a Declared)], own: &[&str]) -> HashSet<&'a str> {
        let mut declarers: HashMap<&str, Vec<&Value>> = HashMap::new();
        for (_, declared) in stages {
            for (name, schema) in &declared.components {
                declarers.entry(name.as_str()).or_default().push(schema);
            }
        }
        let mut apart: HashSet<&str> = declarers
            .iter()
            .filter(|(name, schemas)| {
                own.contains(name) || schemas.iter().any(|schema| *schema != schemas[0])
            })
            .map(|(name, _)| *name)
            .collect();
        let shared: HashSet<&str> =
            declarers.iter().filter(|(_, s)| s.len() > 1).map(|(name, _)| *name).collect();
        let mut refers: Vec<(&str, BTreeSet<String>)> = Vec::new();
        for (_, declared) in stages {
            for (name, schema) in &declared.components {
                if shared.contains(name.as_str()) {
                    let mut names = referred(schema);
                    names.retain(|to| declared.components.contains_key(to));
                    refers.push((name.as_str(), names));
                }
            }
        }
        loop {
            let more: Vec<&str> = refers
                .iter()
                .filter(|(name, to)| {
                    !apart.contains(name) && to.iter().any(|to| apart.contains(to.as_str()))
                })
                .map(|(name, _)| *name)
                .collect();
            if more.is_empty() {
                return apart;
            }
            apart.extend(more);
        }
    }

    /// Both ways of finding the names kept apart, sorted, on `stages` (each a stage's name and
    /// its components).
    fn apart_both_ways(stages: &[(&str, Value)], own: &[&str]) -> [Vec<String>; 2] {
        let declared: Vec<(&str, Declared)> =
            stages.iter().map(|(stage, c)| (*stage, declared(json!({}), c.clone()))).collect();
        let stages: Vec<(&str, &Declared)> = declared.iter().map(|(s, d)| (*s, d)).collect();
        let sorted = |names: HashSet<&str>| {
            let mut names: Vec<String> = names.into_iter().map(String::from).collect();
            names.sort();
            names
        };
        [sorted(apart(&stages, own)), sorted(apart_by_rounds(&stages, own))]
    }

    #[test]
    fn one_pass_keeps_apart_what_rounds_until_nothing_changes_do() {
        let item = |t: &str| json!({"type": t});
        let both = |a: Value, b: Value, own: &[&str]| apart_both_ways(&[("a", a), ("b", b)], own);
        // A cycle alike in both stages that reaches a name declared differently: all of it.
        let cycle = |t| json!({"A": {"anyOf": [to("B"), to("C")]}, "B": to("A"), "C": item(t), "D": to("B")});
        let [one_pass, rounds] = both(cycle("integer"), cycle("string"), &[]);
        assert_eq!(one_pass, ["A", "B", "C", "D"]);
        assert_eq!(one_pass, rounds);
        // A cycle that reaches nothing apart, and a self-reference: shared as they are.
        let alike = json!({"A": to("B"), "B": to("A"), "S": to("S"), "T": to("S")});
        let [one_pass, rounds] = both(alike.clone(), alike, &[]);
        assert!(one_pass.is_empty() && rounds.is_empty(), "{one_pass:?} {rounds:?}");
        // Corral's own name, reached through a self-referring name, a bare mapping name and
        // a percent-escaped `$ref`; a name declared once is never apart for what it refers to,
        // nor a shared one for a name its stage does not declare.
        let a = json!({
            "Error": {}, "S": {"anyOf": [to("S"), to("Error")]}, "M": {"discriminator":
                {"propertyName": "t", "mapping": {"x": "S"}}}, "P[1]": to("M"),
            "Q": to("P%5B1%5D"), "Once": to("Error"), "Far": to("Only"),
        });
        let b = json!({
            "Error": {}, "S": {"anyOf": [to("S"), to("Error")]}, "M": {"discriminator":
                {"propertyName": "t", "mapping": {"x": "S"}}}, "P[1]": to("M"),
            "Q": to("P%5B1%5D"), "Far": to("Only"), "Only": item("integer"),
        });
        let [one_pass, rounds] = both(a.clone(), b.clone(), &["Error"]);
        assert_eq!(one_pass, ["Error", "M", "P[1]", "Q", "S"]);
        assert_eq!(one_pass, rounds);
        let [one_pass, rounds] = apart_both_ways(&[("a", a), ("b", b), ("c", json!({}))], &[]);
        assert!(one_pass.is_empty(), "{one_pass:?}");
        assert_eq!(one_pass, rounds);
    }

    #[test]
    fn one_pass_and_rounds_agree_on_random_graphs() {
        // A small linear congruential generator: the same graphs on every run, no dependency.
        let mut seed: u64 = 0x5eed;
        let mut next = move |below: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % below
        };
        let mut agreed_nonempty = 0;
        for _ in 0..300 {
            let names = 1 + next(12);
            let stages = 1 + next(3);
            // Each name's schema: the same in every stage that declares it, but now and then
            // one stage's differs; its references to names of any stage, cycles included.
            let schemas: Vec<Value> = (0..names)
                .map(|_| {
                    let refs: Vec<Value> =
                        (0..next(3)).map(|_| to(&format!("N{}", next(names)))).collect();
                    json!({"anyOf": refs})
                })
                .collect();
            let graph: Vec<(&str, Value)> = ["a", "b", "c"][..stages as usize]
                .iter()
                .map(|stage| {
                    let mut components = Map::new();
                    for (n, schema) in schemas.iter().enumerate() {
                        if next(4) == 0 {
                            continue;
                        }
                        let mut schema = schema.clone();
                        if next(10) == 0 {
                            schema["title"] = json!(stage);
                        }
                        components.insert(format!("N{n}"), schema);
                    }
                    (*stage, Value::Object(components))
                })
                .collect();
            let own = if next(5) == 0 { vec!["N0"] } else { vec![] };
            let [one_pass, rounds] = apart_both_ways(&graph, &own);
            assert_eq!(one_pass, rounds, "{graph:?} own {own:?}");
            agreed_nonempty += usize::from(!one_pass.is_empty());
        }
        assert!(agreed_nonempty > 50, "too few graphs with names apart: {agreed_nonempty}");
    }

    #[test]
    fn names_wanted_alike_take_the_next_free_suffix_each() {
        let mut taken = Taken::new(["N_.3".to_string(), "a".to_string()]);
        let names: Vec<String> = (0..5).map(|_| taken.unique("N_".into())).collect();
        assert_eq!(names, ["N_", "N_.2", "N_.4", "N_.5", "N_.6"]);
        // A suffixed name given out is taken for a name wanted as it is, which has suffixes of
        // its own.
        assert_eq!(taken.unique("N_.2".into()), "N_.2.2");
        assert_eq!(
            (taken.unique("a".into()), taken.unique("a".into())),
            ("a.2".into(), "a.3".into())
        );
    }

    #[test]
    fn a_name_two_stages_declare_differently_is_named_per_stage() {
        let a = declared(to("Item"), json!({"Item": {"type": "integer"}}));
        let b = declared(to("Item"), json!({"Item": {"type": "string"}}));
        let named = name([("a", &a), ("b", &b)], &[]);
        assert_eq!(
            Value::Object(named.components),
            json!({"a.Item": {"type": "integer"}, "b.Item": {"type": "string"}})
        );
        assert_eq!(named.stages["a"].input, Some(to("a.Item")));
        assert_eq!(named.stages["b"].input, Some(to("b.Item")));
    }

    #[test]
    fn a_name_every_stage_declares_alike_is_shared_as_it_is() {
        let a = declared(to("Item"), json!({"Item": {"type": "integer"}}));
        let b =
            declared(json!({"type": "array", "items": to("Item")}), a.components.clone().into());
        let named = name([("a", &a), ("b", &b)], &["Error"]);
        assert_eq!(Value::Object(named.components), json!({"Item": {"type": "integer"}}));
        assert_eq!(named.stages["a"].input, Some(to("Item")));
        assert_eq!(named.stages["b"].input, Some(json!({"type": "array", "items": to("Item")})));
    }

    #[test]
    fn a_workers_component_named_like_corrals_own_is_renamed() {
        let error = json!({"type": "object", "properties": {"why": {"type": "string"}}});
        let a = declared(to("Error"), json!({"Error": error}));
        let named = name([("a", &a)], &["Error"]);
        assert_eq!(Value::Object(named.components), json!({"a.Error": error}));
        assert_eq!(named.stages["a"].input, Some(to("a.Error")));
    }

    #[test]
    fn a_schema_alike_in_two_stages_that_refers_to_a_name_renamed_apart_is_renamed_too() {
        let pair = json!({"type": "array", "prefixItems": [to("Item"), to("Item")]});
        let a = declared(to("Pair"), json!({"Pair": pair, "Item": {"type": "integer"}}));
        let b = declared(to("Pair"), json!({"Pair": pair, "Item": {"type": "string"}}));
        let named = name([("a", &a), ("b", &b)], &[]);
        let components = Value::Object(named.components);
        for stage in ["a", "b"] {
            let pair = &components[format!("{stage}.Pair")];
            assert_eq!(pair["prefixItems"][1], to(&format!("{stage}.Item")), "{components}");
            assert_eq!(named.stages[stage].input, Some(to(&format!("{stage}.Pair"))));
        }
        assert!(components.get("Pair").is_none() && components.get("Item").is_none());
    }

    #[test]
    fn every_reference_is_rewritten_and_nothing_else() {
        let schema = json!({
            "anyOf": [to("Item"), {"$ref": format!("{PREFIX}Item/properties/a")}],
            "discriminator": {"propertyName": "t",
                "mapping": {"i": format!("{PREFIX}Item"), "bare": "Item"}},
            // Data and names, not references.
            "properties": {"$ref": {"type": "string"}, "enum": to("Item")},
            "const": to("Item"),
            "examples": [to("Item")],
        });
        let a = declared(schema, json!({"Item": {"type": "integer"}}));
        let b = declared(json!({}), json!({"Item": {"type": "string"}}));
        let named = name([("a", &a), ("b", &b)], &[]);
        let input = named.stages["a"].input.clone().unwrap();
        assert_eq!(
            input["anyOf"],
            json!([to("a.Item"), {"$ref": format!("{PREFIX}a.Item/properties/a")}])
        );
        let mapping = &input["discriminator"]["mapping"];
        assert_eq!(mapping["i"], json!(format!("{PREFIX}a.Item")));
        assert_eq!(mapping["bare"], json!(format!("{PREFIX}a.Item")), "a bare name followed");
        assert_eq!(input["properties"], json!({"$ref": {"type": "string"}, "enum": to("a.Item")}));
        assert_eq!((&input["const"], &input["examples"]), (&to("Item"), &json!([to("Item")])));
    }

    #[test]
    fn a_name_openapi_does_not_allow_is_respelled_with_its_references() {
        // `Page[Item]` made the document invalid: a component's key is `^[a-zA-Z0-9._-]+$`.
        let page = json!({"type": "array", "items": to("Item")});
        let a = declared(
            json!({"anyOf": [to("Page[Item]"), to("a~1b~0c"), to("Größe"), to(""),
                to("Page%5BItem%5D")]}),
            json!({"Page[Item]": page, "Item": {}, "a/b~c": {}, "Größe": {}, "": {}}),
        );
        let named = name([("a", &a)], &[]);
        let names: Vec<&String> = named.components.keys().collect();
        assert_eq!(names, ["Gr__e", "Item", "Page_Item_", "_", "a_b_c"]);
        assert_eq!(named.components["Page_Item_"], page, "its own references kept");
        let input = named.stages["a"].input.clone().unwrap();
        let respelled = [to("Page_Item_"), to("a_b_c"), to("Gr__e"), to("_"), to("Page_Item_")];
        assert_eq!(input["anyOf"], json!(respelled), "a URI's escapes read too");
    }

    #[test]
    fn a_literal_percent_and_a_bare_mapping_name_reach_their_respelled_component() {
        // `a%2Fb` is a name with a `%` in it (decoded, `a/b` names nothing); a mapping's bare
        // `a%41` is that name, not `aA`, and a bare `A#B` is a name too.
        let schema = json!({
            "anyOf": [to("a%2Fb")],
            "discriminator": {"propertyName": "t", "mapping": {"x": "a%41", "y": "A#B"}},
        });
        let a = declared(schema, json!({"a%2Fb": {}, "aA": {}, "a%41": {}, "A#B": {}}));
        let named = name([("a", &a)], &[]);
        let names: Vec<&String> = named.components.keys().collect();
        assert_eq!(names, ["A_B", "aA", "a_2Fb", "a_41"]);
        let input = named.stages["a"].input.clone().unwrap();
        assert_eq!(input["anyOf"], json!([to("a_2Fb")]));
        let mapping = &input["discriminator"]["mapping"];
        assert_eq!(mapping["x"], json!(format!("{PREFIX}a_41")));
        assert_eq!(mapping["y"], json!(format!("{PREFIX}A_B")));
    }

    #[test]
    fn a_respelled_name_stays_shared_apart_or_clear_of_a_name_taken() {
        let page = json!({"type": "object"});
        let a = declared(to("Page[Item]"), json!({"Page[Item]": page, "my item": {}}));
        let b = declared(
            json!({"anyOf": [to("Page[Item]"), to("Page_Item_"), to("my item")]}),
            json!({"Page[Item]": page, "Page_Item_": {"type": "string"}, "my item": {"a": 1}}),
        );
        let named = name([("a", &a), ("b", &b)], &[]);
        let names: Vec<&String> = named.components.keys().collect();
        // Declared alike, shared; the respelling a worker took already is not given out again;
        // declared differently, apart per stage as any name is.
        assert_eq!(names, ["Page_Item_", "Page_Item_.2", "a.my_item", "b.my_item"]);
        assert_eq!(named.stages["a"].input, Some(to("Page_Item_.2")));
        let b = named.stages["b"].input.clone().unwrap();
        assert_eq!(b["anyOf"], json!([to("Page_Item_.2"), to("Page_Item_"), to("b.my_item")]));
    }

    #[test]
    fn a_prefixed_name_a_worker_took_already_is_not_given_out_again() {
        let a = declared(to("Item"), json!({"Item": {"type": "integer"}}));
        let b = declared(to("a.Item"), json!({"Item": {"type": "string"}, "a.Item": {}}));
        let named = name([("a", &a), ("b", &b)], &[]);
        let names: Vec<&String> = named.components.keys().collect();
        assert_eq!(names, ["a.Item", "a.Item.2", "b.Item"]);
        assert_eq!(named.components["a.Item.2"], json!({"type": "integer"}));
        assert_eq!(named.stages["a"].input, Some(to("a.Item.2")));
        assert_eq!(named.stages["b"].input, Some(to("a.Item")));
    }
}
