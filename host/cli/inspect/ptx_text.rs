//! The entry functions of a PTX text, with where each starts.

/// One `.entry` of a PTX text.
#[derive(Debug, Clone, Copy)]
pub struct EntrySpan<'a> {
    /// Entry-point name.
    pub name: &'a str,
    /// Line (0-based) of its `.entry` header in the whole text.
    pub first_line: usize,
    /// From the header to the `}` that closes the body (column 0), inclusive.
    pub text: &'a str,
}

/// Every `.entry` of `ptx`, in order of appearance.
pub fn entry_spans(ptx: &str) -> Vec<EntrySpan<'_>> {
    let mut spans = Vec::new();
    let mut offset = 0;
    let mut open: Option<(&str, usize, usize)> = None; // name, first line, byte offset
    for (number, line) in ptx.split_inclusive('\n').enumerate() {
        let end = offset + line.len();
        if let Some(name) = entry_name(line) {
            open = Some((name, number, offset));
        } else if let (Some((name, first_line, start)), "}") = (open, line.trim_end()) {
            spans.push(EntrySpan { name, first_line, text: &ptx[start..end] });
            open = None;
        }
        offset = end;
    }
    if let Some((name, first_line, start)) = open {
        spans.push(EntrySpan { name, first_line, text: &ptx[start..] });
    }
    spans
}

/// The name declared by a `.entry` header line.
fn entry_name(line: &str) -> Option<&str> {
    let rest = line.trim_start();
    let rest = rest.strip_prefix(".visible ").unwrap_or(rest).trim_start();
    let rest = rest.strip_prefix(".entry ")?.trim_start();
    let name = rest.split(['(', ' ', '\t', '\r', '\n']).next()?;
    (!name.is_empty()).then_some(name)
}

/// The entry named `name` in `ptx`, or an error listing the entries there are.
pub fn find_entry<'a>(ptx: &'a str, name: &str) -> Result<EntrySpan<'a>, String> {
    let spans = entry_spans(ptx);
    spans.iter().find(|s| s.name == name).copied().ok_or_else(|| {
        let names: Vec<&str> = spans.iter().map(|s| s.name).collect();
        format!("no entry `{name}` in the PTX; the entries are: {}", names.join(", "))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_entries_and_their_bodies() {
        let ptx = ".version 7.8\n.func helper\n(\n)\n;\n.visible .entry k1(\n\t.param .u64 p\n)\n{\n\t{ mov.u32 %r1, 0; }\n\tret;\n}\n\
                   // -- End function\n.entry k2()\n{\n\texit;\n}\n";
        let spans = entry_spans(ptx);
        assert_eq!(spans.len(), 2);
        assert_eq!((spans[0].name, spans[0].first_line), ("k1", 5));
        assert!(spans[0].text.starts_with(".visible .entry k1(") && spans[0].text.ends_with("ret;\n}\n"));
        assert_eq!((spans[1].name, spans[1].text), ("k2", ".entry k2()\n{\n\texit;\n}\n"));
        assert!(find_entry(ptx, "k3").unwrap_err().contains("k1, k2"));
    }

    #[test]
    fn finds_every_shipped_entry() {
        for ptx in [paged_decode::ptx::PTX, paged_decode::ptx::PTX_SM90] {
            let names: Vec<&str> = entry_spans(ptx).iter().map(|s| s.name).collect();
            assert_eq!(names, paged_decode::ptx::entries(ptx));
        }
    }
}
