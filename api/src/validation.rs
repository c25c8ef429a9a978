//! Schema validation shared by the kinds: bounds for the OpenAPI schema and
//! CEL rules (`x-kubernetes-validations`) whose messages tell the user what to
//! fix. Each public-in-crate function here is a schemars transform
//! (`#[schemars(transform = ...)]`) or a building block of one.
//!
//! Every string and list a rule reads has a `maxLength`/`maxItems` so that the
//! API server's CEL cost estimate stays small.

use kube::core::{Message, Rule};
use schemars::Schema;
use serde_json::{Value, json};

/// Longest DAOS pool or container label (`DAOS_PROP_LABEL_MAX_LEN`).
const LABEL_MAX: u64 = 127;
/// Longest ACE or principal dpufs accepts; DAOS budgets about 256 bytes per ACE.
const ACE_MAX: u64 = 256;
/// Most ACEs in one ACL. DAOS caps an ACL at 64 KiB, about 256 ACEs.
const ACL_MAX_ITEMS: u64 = 64;
/// Longest Kubernetes object name (DNS subdomain).
const OBJECT_NAME_MAX: u64 = 253;
/// Longest Kubernetes namespace name (DNS label).
const NAMESPACE_MAX: u64 = 63;
/// Longest DAOS object class name dpufs accepts (e.g. `EC_16P3GX`).
const OCLASS_MAX: u64 = 32;

/// A rule whose failure message is the CEL expression `message` (it may use
/// `self` to quote the offending value).
pub(crate) fn rule(rule: &str, message: &str) -> Rule {
    Rule::new(rule).message(Message::Expression(message.to_string()))
}

/// Appends `rule` to the schema's `x-kubernetes-validations`.
pub(crate) fn push(schema: &mut Schema, rule: Rule) {
    kube::core::validate(schema, rule).expect("a CEL rule serializes to JSON");
}

/// Sets a keyword on the schema (bounds such as `maxLength`).
fn set(schema: &mut Schema, keyword: &str, value: Value) {
    schema.insert(keyword.to_string(), value);
}

/// Applies `f` to the schema of a list's items.
fn items(schema: &mut Schema, f: impl FnOnce(&mut Schema)) {
    let slot = schema
        .get_mut("items")
        .expect("transform applied to a list schema");
    let mut item = Schema::try_from(slot.take()).expect("list items have an object schema");
    f(&mut item);
    *slot = item.to_value();
}

/// A list of unique values (`x-kubernetes-list-type: set`) of at most `max` items.
fn set_list(schema: &mut Schema, max: u64) {
    set(schema, "maxItems", json!(max));
    set(schema, "x-kubernetes-list-type", json!("set"));
}

/// A transition rule on a struct: the optional field `field` may be neither
/// changed, added nor removed once the object exists.
pub(crate) fn immutable_field(schema: &mut Schema, field: &str, message: &str) {
    field_rule(
        schema,
        field,
        format!(
            "has(self.{field}) == has(oldSelf.{field}) && (!has(self.{field}) || self.{field} == oldSelf.{field})"
        ),
        message,
    );
}

/// A transition rule on a struct: the optional field `field` may be added once the object
/// exists, but never changed or removed.
pub(crate) fn settled_field(schema: &mut Schema, field: &str, message: &str) {
    field_rule(
        schema,
        field,
        format!("!has(oldSelf.{field}) || (has(self.{field}) && self.{field} == oldSelf.{field})"),
        message,
    );
}

/// A rule on a struct, reported at its field `field`.
fn field_rule(schema: &mut Schema, field: &str, rule: String, message: &str) {
    push(
        schema,
        Rule::new(rule)
            .message(message)
            .field_path(format!(".{field}")),
    );
}

/// A transition rule on a required field or struct: it keeps its value forever.
pub(crate) fn immutable(schema: &mut Schema, message: &str) {
    push(schema, Rule::new("self == oldSelf").message(message));
}

/// The name of a Kubernetes object (DNS subdomain), such as a reference to
/// another dpufs object or a Secret.
pub(crate) fn object_name(schema: &mut Schema) {
    set(schema, "maxLength", json!(OBJECT_NAME_MAX));
    push(
        schema,
        rule(
            "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",
            "'\"' + self + '\" is not a Kubernetes object name: use lower-case letters, digits, - and ., starting and ending with a letter or digit'",
        ),
    );
}

/// `DaosPool.spec.systemRef`: the DaosSystem the pool lives in.
pub(crate) fn system_ref(schema: &mut Schema) {
    object_name(schema);
    immutable(
        schema,
        "systemRef cannot be changed: the pool lives in that DAOS system; create a new DaosPool instead",
    );
}

/// `DaosContainer.spec.poolRef`: the DaosPool the container lives in.
pub(crate) fn pool_ref(schema: &mut Schema) {
    object_name(schema);
    immutable(
        schema,
        "poolRef cannot be changed: the container lives in that pool; create a new DaosContainer instead",
    );
}

/// A list of DaosPool names.
pub(crate) fn pool_names(schema: &mut Schema) {
    set(schema, "minItems", json!(1));
    set_list(schema, 64);
    items(schema, object_name);
}

/// A namespace name (DNS label).
pub(crate) fn namespace_name(schema: &mut Schema) {
    set(schema, "maxLength", json!(NAMESPACE_MAX));
    push(
        schema,
        rule(
            "self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",
            "'\"' + self + '\" is not a namespace name: use at most 63 lower-case letters, digits and -, starting and ending with a letter or digit'",
        ),
    );
}

/// A list of namespace names.
pub(crate) fn namespace_names(schema: &mut Schema) {
    set(schema, "minItems", json!(1));
    set_list(schema, 256);
    items(schema, namespace_name);
}

/// The DAOS system name (`DAOS_SYS_NAME_MAX` is 15 bytes); it never changes.
pub(crate) fn system_name(schema: &mut Schema) {
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(15));
    push(
        schema,
        rule(
            "self.matches('^[A-Za-z0-9._-]+$')",
            "'system name \"' + self + '\" may only contain letters, digits, ., _ and -'",
        ),
    );
    immutable(
        schema,
        "name cannot be changed: it identifies the DAOS system; create a new DaosSystem to use another system",
    );
}

/// Management service endpoints: `host` or `host:port`, IPv6 in brackets.
pub(crate) fn endpoints(schema: &mut Schema) {
    set(schema, "minItems", json!(1));
    set_list(schema, 32);
    items(schema, |endpoint| {
        set(endpoint, "maxLength", json!(OBJECT_NAME_MAX + 8));
        push(
            endpoint,
            rule(
                "self.matches('^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*|\\\\[[0-9A-Fa-f:.]+\\\\])(:[0-9]{1,5})?$')",
                "'endpoint \"' + self + '\" must be host or host:port (the port defaults to 10001), for example daos-0.example.com:10001, 10.0.0.5 or [fd00::5]:10001'",
            ),
        );
    });
}

/// The fabric data endpoint of an engine: an IP address (IPv6 in brackets) and a
/// port, never a host name (the fabric connects to addresses).
pub(crate) fn data_endpoint(schema: &mut Schema) {
    set(schema, "maxLength", json!(64));
    push(
        schema,
        rule(
            "self.matches('^(([0-9]{1,3}[.]){3}[0-9]{1,3}|\\\\[[0-9A-Fa-f:.]+\\\\]):[0-9]{1,5}$')",
            "'dataEndpoint \"' + self + '\" must be ip:port, the address of the engine fabric data service, for example 10.0.0.5:7000 or [fd00::5]:7000'",
        ),
    );
}

/// The DAOS version of the servers: `major.minor.patch`, and a minor version
/// dpufs speaks.
pub(crate) fn daos_version(schema: &mut Schema) {
    set(schema, "maxLength", json!(32));
    push(
        schema,
        rule(
            "self.matches('^[0-9]+[.][0-9]+[.][0-9]+$')",
            "'version \"' + self + '\" must be major.minor.patch, for example 2.8.0'",
        ),
    );
    push(
        schema,
        rule(
            "!self.matches('^[0-9]+[.][0-9]+[.][0-9]+$') || self.startsWith('2.6.') || self.startsWith('2.8.')",
            "'dpufs speaks the DAOS 2.6 and 2.8 management APIs; DAOS ' + self + ' is not supported'",
        ),
    );
}

/// A DAOS pool label.
pub(crate) fn pool_label(schema: &mut Schema) {
    set(schema, "minLength", json!(1));
    set(schema, "maxLength", json!(LABEL_MAX));
    push(
        schema,
        rule(
            "self.matches('^[A-Za-z0-9._:-]+$')",
            "'label \"' + self + '\" may only contain letters, digits, ., _, : and - (DAOS label rules)'",
        ),
    );
    push(
        schema,
        rule(
            "!self.matches('^([0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$')",
            "'label \"' + self + '\" reads as a UUID, which DAOS does not allow; use a name that is not a UUID'",
        ),
    );
}

/// A DAOS container label: a pool label that is not DAOS's "no label" marker.
pub(crate) fn container_label(schema: &mut Schema) {
    pool_label(schema);
    push(
        schema,
        Rule::new("self != 'container_label_not_set'").message(
            "label container_label_not_set is what DAOS reports for containers without a label and cannot be set; choose another label",
        ),
    );
}

/// A DAOS principal naming a user or group: `name@` or `name@domain`.
pub(crate) fn principal(schema: &mut Schema) {
    set(schema, "maxLength", json!(ACE_MAX));
    push(
        schema,
        rule(
            "self.matches('^[^:@ ]+@[^:@ ]*$')",
            "'\"' + self + '\" is not a DAOS principal: write the user or group name followed by @, for example alice@ or admins@'",
        ),
    );
}

/// The user principal a tenant's volumes are granted: a principal that is not
/// one of the special ones, and that never changes.
pub(crate) fn tenant_principal(schema: &mut Schema) {
    principal(schema);
    push(
        schema,
        rule(
            "!(self in ['OWNER@', 'GROUP@', 'EVERYONE@'])",
            "self + ' is a special DAOS principal; name the tenant user, for example team-a@'",
        ),
    );
    immutable(
        schema,
        "principal cannot be changed: it is written into the ACLs of this tenant's containers; create a new DaosTenant instead",
    );
}

/// An ACL: a set of ACE strings `TYPE:FLAGS:PRINCIPAL:PERMS` whose permission
/// letters come from `perms`.
fn acl(schema: &mut Schema, perms: &str) {
    set_list(schema, ACL_MAX_ITEMS);
    items(schema, |ace| {
        set(ace, "maxLength", json!(ACE_MAX));
        push(
            ace,
            rule(
                &format!("self.matches('^A:G?:[^:@ ]+@[^:@ ]*:[{perms}]*$')"),
                &format!(
                    "'ACE \"' + self + '\" must be TYPE:FLAGS:PRINCIPAL:PERMS with type A, flags empty or G (group), a principal such as alice@, OWNER@, GROUP@ or EVERYONE@, and permissions from {perms}; for example A::alice@:rw or A:G:admins@:r'"
                ),
            ),
        );
        push(
            ace,
            rule(
                "!self.startsWith('A::GROUP@:')",
                "'ACE \"' + self + '\": GROUP@ is a group and needs the G flag, as in A:G:GROUP@:r'",
            ),
        );
        push(
            ace,
            rule(
                "!self.startsWith('A:G:OWNER@:') && !self.startsWith('A:G:EVERYONE@:')",
                "'ACE \"' + self + '\": OWNER@ and EVERYONE@ are not groups; drop the G flag, as in A::OWNER@:rw'",
            ),
        );
    });
}

/// A pool ACL: permissions r w c d t T a A.
pub(crate) fn pool_acl(schema: &mut Schema) {
    acl(schema, "rwcdtTaA");
}

/// A container ACL: the pool permissions plus o (set owner).
pub(crate) fn container_acl(schema: &mut Schema) {
    acl(schema, "rwdtTaAo");
}

/// A DAOS object class name such as `SX`, `RP_3G1` or `EC_8P2GX`.
pub(crate) fn object_class(schema: &mut Schema) {
    set(schema, "maxLength", json!(OCLASS_MAX));
    push(
        schema,
        rule(
            "self.matches('^(S([0-9]+|X)|RP_[0-9]+G([0-9]+|X)|EC_[0-9]+P[0-9]+G([0-9]+|X))$')",
            "'\"' + self + '\" is not a DAOS object class; use S<n>/SX (no redundancy), RP_<replicas>G<groups> or EC_<data>P<parity>G<groups>, for example SX, RP_3G1 or EC_8P2GX'",
        ),
    );
}

/// A list of two tier percentages [metadata, data] that add up to 100.
///
/// The message is built from constant strings only: the API server estimates
/// the cost of `string(int)` as that of the longest string a request may hold,
/// and refuses a CRD whose message expressions could cost that much.
pub(crate) fn tier_ratio(schema: &mut Schema) {
    set(schema, "minItems", json!(2));
    set(schema, "maxItems", json!(2));
    push(
        schema,
        rule(
            "self.size() != 2 || self[0] + self[1] == 100",
            "(self[0] + self[1] > 100 ? 'tierRatio adds up to more than 100' : 'tierRatio adds up to less than 100') + '; the metadata and data percentages must add up to 100, for example [6, 94]'",
        ),
    );
}

/// A list of exactly two byte sizes [metadata, data].
pub(crate) fn tier_bytes(schema: &mut Schema) {
    set(schema, "minItems", json!(2));
    set(schema, "maxItems", json!(2));
}

/// Pool service replicas: an odd number from 1 to 9 (a plain message: see
/// [`tier_ratio`] for why it does not quote the value).
pub(crate) fn service_replicas(schema: &mut Schema) {
    push(
        schema,
        Rule::new("self % 2 == 1").message(
            "serviceReplicas is even; use an odd number (1, 3, 5, 7 or 9) so the replicas can always form a majority",
        ),
    );
}

/// A set of engine ranks.
pub(crate) fn ranks(schema: &mut Schema) {
    set(schema, "minItems", json!(1));
    set_list(schema, 4096);
}

/// The pool's self-heal flags: a set of at most three values.
pub(crate) fn self_heal(schema: &mut Schema) {
    set_list(schema, 3);
}

/// `status.conditions`: a map keyed by condition type, as for built-in kinds.
pub(crate) fn conditions(schema: &mut Schema) {
    set(schema, "x-kubernetes-list-type", json!("map"));
    set(schema, "x-kubernetes-list-map-keys", json!(["type"]));
}
