//! Checking a client-supplied pool or container property against DAOS's
//! table: known number, writable now, value of the right kind and range.

use crate::error::{Result, der};
use dpufs_proto::daos::der::Der;
use dpufs_proto::daos::props::{self, Access, PropDef, PropValue};

/// Pool or container properties.
#[derive(Debug, Clone, Copy)]
pub struct PropTable {
    /// "pool" or "container", for messages.
    pub kind: &'static str,
    pub defs: &'static [PropDef],
    /// The ACL's number: set with the ACL calls, never as a property.
    pub acl: u32,
}

pub const POOL: PropTable = PropTable {
    kind: "pool",
    defs: props::POOL_PROPS,
    acl: props::POOL_ACL,
};
pub const CONTAINER: PropTable = PropTable {
    kind: "container",
    defs: props::CONT_PROPS,
    acl: props::CONT_ACL,
};

impl PropTable {
    /// The definition of a property a client may set now, with its checked value.
    pub fn checked<V: Into<PropValue>>(
        &self,
        number: u32,
        value: Option<V>,
        at_create: bool,
    ) -> Result<(&'static PropDef, PropValue)> {
        let kind = self.kind;
        if number == self.acl {
            return Err(der(
                Der::Inval,
                format!("the {kind} ACL is set with the ACL calls, not as a property"),
            ));
        }
        let def = props::find(self.defs, number).ok_or_else(|| {
            der(
                Der::Inval,
                format!("unknown {kind} property number {number:#x}"),
            )
        })?;
        let writable = match def.access {
            Access::ReadWrite => true,
            Access::CreateOnly => at_create,
            Access::ReadOnly => false,
        };
        if !writable {
            let when = if def.access == Access::ReadOnly {
                "is read-only"
            } else {
                "can only be set at create"
            };
            return Err(der(
                Der::NoPerm,
                format!("{kind} property {} {when}", def.name),
            ));
        }
        let value = value.map(Into::into).ok_or_else(|| {
            der(
                Der::Inval,
                format!("{kind} property {} has no value", def.name),
            )
        })?;
        def.check(&value)
            .map_err(|e| der(Der::Inval, e.to_string()))?;
        Ok((def, value))
    }
}
