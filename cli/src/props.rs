//! Property lists as dmg and daos take them (`label:tank,reclaim:time`) and
//! properties as they are shown, for pools and containers alike: both read the
//! one property table the engine enforces (`dpufs_proto::daos::props`), so
//! names, ranges and choice words cannot drift apart.

use crate::output::Table;
use anyhow::{Context, bail};
use dpufs_proto::daos::props::{CONT_PROPS, POOL_PROPS, PropDef, PropValue, find, find_by_name};
use serde::Serialize;

/// The properties of one kind of object.
#[derive(Debug, Clone, Copy)]
pub struct Props {
    /// `pool` or `container`, for messages.
    pub what: &'static str,
    pub table: &'static [PropDef],
}

pub const POOL: Props = Props {
    what: "pool",
    table: POOL_PROPS,
};

pub const CONT: Props = Props {
    what: "container",
    table: CONT_PROPS,
};

/// One property as shown: name, number, value in words, and the raw value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PropRow {
    pub name: String,
    pub number: u32,
    pub value: String,
    pub raw: PropValue,
}

impl Props {
    /// The definition of a property by name; unknown names list the known ones.
    pub fn def(&self, name: &str) -> anyhow::Result<&'static PropDef> {
        find_by_name(self.table, name.trim()).with_context(|| {
            let known: Vec<&str> = self.table.iter().map(|p| p.name).collect();
            format!(
                "unknown {} property {name:?}; known properties: {}",
                self.what,
                known.join(", ")
            )
        })
    }

    /// Parses `name:value[,name:value]`, from one or more arguments.
    pub fn parse_list(&self, args: &[String]) -> anyhow::Result<Vec<(u32, PropValue)>> {
        let mut out: Vec<(u32, PropValue)> = Vec::new();
        for item in args.iter().flat_map(|a| a.split(',')) {
            let Some((name, text)) = item.split_once(':') else {
                bail!("property {item:?}: expected name:value");
            };
            let def = self.def(name)?;
            if out.iter().any(|(n, _)| *n == def.number) {
                bail!("{} property {} is given twice", self.what, def.name);
            }
            out.push((def.number, def.parse(text.trim())?));
        }
        Ok(out)
    }

    /// Rows for display; numbers missing from the table are shown as `#n`.
    pub fn rows(&self, values: impl IntoIterator<Item = (u32, PropValue)>) -> Vec<PropRow> {
        values
            .into_iter()
            .map(|(number, raw)| match find(self.table, number) {
                Some(def) => PropRow {
                    name: def.name.into(),
                    number,
                    value: def.display(&raw),
                    raw,
                },
                None => PropRow {
                    name: format!("#{number}"),
                    number,
                    value: match &raw {
                        PropValue::Str(s) => s.clone(),
                        PropValue::Num(n) => n.to_string(),
                    },
                    raw,
                },
            })
            .collect()
    }
}

/// Prints property rows as a table.
pub fn print_rows(rows: &[PropRow]) {
    let mut t = Table::new(&["Name", "Number", "Value"]);
    for r in rows {
        t.row([r.name.clone(), r.number.to_string(), r.value.clone()]);
    }
    t.print();
}

#[cfg(test)]
mod tests {
    use super::*;
    use dpufs_proto::daos::props::{CONT_LAYOUT_TYPE, POOL_LABEL, POOL_RD_FAC};

    fn list(p: Props, s: &str) -> anyhow::Result<Vec<(u32, PropValue)>> {
        p.parse_list(&[s.to_string()])
    }

    #[test]
    fn parses_name_value_lists() {
        let got = list(
            POOL,
            "label:tank,reclaim:time,self_heal:exclude;rebuild,rf:1",
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                (POOL_LABEL, PropValue::Str("tank".into())),
                (5, PropValue::Num(4)),
                (4, PropValue::Num(3)),
                (POOL_RD_FAC, PropValue::Num(1)),
            ]
        );
        assert_eq!(
            list(CONT, "layout_type:POSIX").unwrap(),
            vec![(CONT_LAYOUT_TYPE, PropValue::Num(1))]
        );
        // Only the first colon separates: labels may contain colons.
        assert_eq!(
            list(POOL, "label:a:b").unwrap(),
            vec![(POOL_LABEL, PropValue::Str("a:b".into()))]
        );
        let two = POOL
            .parse_list(&["space_rb:10".into(), "scrub:lazy".into()])
            .unwrap();
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn refuses_bad_lists() {
        let unknown = list(POOL, "nonsense:1").unwrap_err().to_string();
        assert!(
            unknown.contains("unknown pool property \"nonsense\""),
            "{unknown}"
        );
        assert!(
            unknown.contains("reclaim"),
            "lists the known names: {unknown}"
        );
        assert!(list(POOL, "reclaim").is_err(), "no colon");
        assert!(list(POOL, "space_rb:101").is_err(), "out of range");
        assert!(list(POOL, "reclaim:sometimes").is_err(), "not a choice");
        assert!(list(POOL, "rf:1,rd_fac:2").is_err(), "given twice");
        assert!(list(POOL, "label:a,").is_err(), "empty item");
    }

    #[test]
    fn rows_use_names_and_words() {
        let rows = POOL.rows([(5, PropValue::Num(4)), (999, PropValue::Num(7))]);
        assert_eq!(
            (rows[0].name.as_str(), rows[0].value.as_str()),
            ("reclaim", "time")
        );
        assert_eq!(
            (rows[1].name.as_str(), rows[1].value.as_str()),
            ("#999", "7")
        );
    }
}
