//! The checker: a request body against a server's schema from the fixture, each break a `Problem`.
use std::cmp::Ordering;

use serde_json::{json, Map, Value};

/// One way a body breaks a server's schema.
#[derive(Debug)]
pub(super) struct Problem {
    /// Dotted path of the field, e.g. `sampling_params.top_k`.
    pub(super) field: String,
    /// About the body's shape: `unknown` (not a field), `untyped` (a field the fixture gives no
    /// type), `null`, `type`. About its values: `min`, `max`, `items` (list length), `empty` (an
    /// empty stop string), `rule` (a constraint between fields).
    pub(super) kind: &'static str,
    pub(super) what: String,
}

impl Problem {
    pub(super) fn is_shape(&self) -> bool {
        matches!(self.kind, "unknown" | "untyped" | "null" | "type")
    }
}

fn push(out: &mut Vec<Problem>, field: &str, kind: &'static str, what: String) {
    out.push(Problem {
        field: field.to_string(),
        kind,
        what,
    });
}

fn name_of(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn is_int(v: &Value) -> bool {
    v.is_i64() || v.is_u64()
}

fn all_ints(items: &[Value]) -> bool {
    items.iter().all(is_int)
}

/// Integers compare exactly (a seed can reach 2^64 - 1, past what f64 holds), anything else as f64.
fn cmp(a: &Value, b: &Value) -> Ordering {
    let int = |v: &Value| v.as_i64().map(i128::from).or(v.as_u64().map(i128::from));
    match (int(a), int(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => a.as_f64().unwrap().total_cmp(&b.as_f64().unwrap()),
    }
}

/// Every problem of `body` against `spec`, an object schema (`fields`, `other_fields`, `rules`).
pub(super) fn check(body: &Value, spec: &Value) -> Vec<Problem> {
    let mut out = vec![];
    check_object("", body, spec, &mut out);
    out
}

fn check_object(path: &str, body: &Value, spec: &Value, out: &mut Vec<Problem>) {
    let Some(map) = body.as_object() else {
        push(out, path, "type", format!("is {body}, not an object"));
        return;
    };
    let fields = spec["fields"]
        .as_object()
        .expect("fixture: an object schema without `fields`");
    let other = spec["other_fields"].as_array().cloned().unwrap_or_default();
    for (key, value) in map {
        let name = name_of(path, key);
        if let Some(field) = fields.get(key) {
            check_value(&name, value, field, map, out);
        } else if other.iter().any(|o| o.as_str() == Some(key.as_str())) {
            push(
                out,
                &name,
                "untyped",
                "is a field the server accepts, but the fixture gives no type for it: add its spec"
                    .into(),
            );
        } else {
            push(
                out,
                &name,
                "unknown",
                "is not a field the server accepts".into(),
            );
        }
    }
    for rule in spec["rules"].as_array().into_iter().flatten() {
        check_rule(path, map, rule, out);
    }
}

fn check_value(
    name: &str,
    v: &Value,
    spec: &Value,
    siblings: &Map<String, Value>,
    out: &mut Vec<Problem>,
) {
    if v.is_null() {
        if spec["nullable"] != true {
            push(
                out,
                name,
                "null",
                "is null; the server takes no null here".into(),
            );
        }
        return;
    }
    let ty = spec["type"]
        .as_str()
        .expect("fixture: a field without `type`");
    let typed = match ty {
        "int" => is_int(v),
        "number" => v.is_number(),
        "bool" => v.is_boolean(),
        "string" => v.is_string(),
        "string_or_string_list" => {
            v.is_string() || v.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }
        "int_list" => v.as_array().is_some_and(|a| all_ints(a)),
        "int_or_int_list_list" => v.as_array().is_some_and(|a| {
            all_ints(a)
                || a.iter()
                    .all(|row| row.as_array().is_some_and(|r| all_ints(r)))
        }),
        "object" => return check_object(name, v, spec, out),
        other => panic!("fixture: {name} has unknown type {other}"),
    };
    if !typed {
        push(out, name, "type", format!("is {v}, not {ty}"));
        return;
    }
    // The server overwrites this field when a sibling says so (SGLang sets top_k = 1 for a
    // temperature below 1e-6), so whatever was sent passes.
    if let Some(when) = spec.get("unchecked_when") {
        let t = siblings
            .get(when["field"].as_str().unwrap())
            .and_then(Value::as_f64);
        if t.is_some_and(|t| t >= 0.0 && t < when["below"].as_f64().unwrap()) {
            return;
        }
    }
    match v {
        Value::Number(_) => range(
            out,
            name,
            v,
            (spec.get("min"), spec["exclusive_min"] == true),
            (spec.get("max"), spec["exclusive_max"] == true),
            &spec["also_allowed"],
        ),
        Value::String(s) if s.is_empty() && spec["no_empty_strings"] == true => {
            push(out, name, "empty", "is an empty string".into());
        }
        Value::Array(items) => {
            let len = json!(items.len());
            if spec.get("min_items").is_some_and(|m| cmp(&len, m).is_lt()) {
                push(
                    out,
                    name,
                    "items",
                    format!("has {len} items, fewer than {}", spec["min_items"]),
                );
            }
            if spec.get("max_items").is_some_and(|m| cmp(&len, m).is_gt()) {
                push(
                    out,
                    name,
                    "items",
                    format!("has {len} items, more than {}", spec["max_items"]),
                );
            }
            // Items of a list, or of the rows of a list of lists.
            let flat = items.iter().flat_map(|i| {
                i.as_array()
                    .map_or(std::slice::from_ref(i), |r| r.as_slice())
            });
            for item in flat {
                match item {
                    Value::String(s) if s.is_empty() && spec["no_empty_strings"] == true => {
                        push(out, name, "empty", "holds an empty string".into())
                    }
                    Value::Number(_) => range(
                        out,
                        name,
                        item,
                        (spec.get("item_min"), false),
                        (spec.get("item_max"), false),
                        &Value::Null,
                    ),
                    _ => {}
                }
            }
        }
        _ => {}
    }
}

/// `v` against an optional (bound, exclusive) at each end; `also` lists values accepted anyway.
fn range(
    out: &mut Vec<Problem>,
    name: &str,
    v: &Value,
    (min, min_exclusive): (Option<&Value>, bool),
    (max, max_exclusive): (Option<&Value>, bool),
    also: &Value,
) {
    if also
        .as_array()
        .is_some_and(|a| a.iter().any(|x| cmp(x, v).is_eq()))
    {
        return;
    }
    if let Some(min) = min {
        let o = cmp(v, min);
        if o.is_lt() || (min_exclusive && o.is_eq()) {
            let strict = if min_exclusive { "or equal to " } else { "" };
            push(
                out,
                name,
                "min",
                format!("holds {v}, below {strict}the minimum {min}"),
            );
        }
    }
    if let Some(max) = max {
        let o = cmp(v, max);
        if o.is_gt() || (max_exclusive && o.is_eq()) {
            let strict = if max_exclusive { "or equal to " } else { "" };
            push(
                out,
                name,
                "max",
                format!("holds {v}, above {strict}the maximum {max}"),
            );
        }
    }
}

fn check_rule(path: &str, map: &Map<String, Value>, rule: &Value, out: &mut Vec<Problem>) {
    let number = |k: &str| map.get(k).filter(|v| v.is_number());
    match rule["kind"].as_str() {
        Some("le") => {
            let (l, r) = (
                rule["left"].as_str().unwrap(),
                rule["right"].as_str().unwrap(),
            );
            if let (Some(a), Some(b)) = (number(l), number(r)) {
                if cmp(a, b).is_gt() {
                    let what = format!("{l} = {a} exceeds {r} = {b} ({})", rule["source"]);
                    push(out, &name_of(path, l), "rule", what);
                }
            }
        }
        Some("n_is_1_when_greedy") => {
            let greedy = rule["greedy_temperature"].as_f64().unwrap();
            let t = map.get("temperature").and_then(Value::as_f64);
            let n = map.get("n").and_then(Value::as_u64).unwrap_or(1);
            if t == Some(greedy) && n > 1 {
                let what = format!(
                    "is {n} with temperature {greedy}: the server takes n = 1 only when greedy ({})",
                    rule["source"]
                );
                push(out, &name_of(path, "n"), "rule", what);
            }
        }
        other => panic!("fixture: unknown rule {other:?}"),
    }
}
