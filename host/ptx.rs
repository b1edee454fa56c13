//! The kernels' PTX (shipped in `ptx/`, or built from `kernels-gpu/` when that is stale; see
//! `build.rs`), and its entry points.

use std::sync::LazyLock;

use crate::types::ArchSku;

pub mod entry;

/// PTX text of every kernel for any GPU from sm_80 on (target `PAGED_DECODE_PTX_ARCH`, default
/// sm_80).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels.ptx"));

/// The same kernels built for sm_90: the decode kernels also take part in programmatic dependent
/// launch (`griddepcontrol`).
pub const PTX_SM90: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm90.ptx"));

/// The build a device of compute capability `(major, minor)` loads: the sm_90 one from 9.0 on.
pub fn build_for(cc: (u32, u32)) -> ArchSku {
    if cc.0 >= 9 { ArchSku::Sm90 } else { ArchSku::Sm80 }
}

/// The build a plan loads on a device of compute capability `cc`: [`build_for`]`(cc)`, or the
/// portable one where the caller turns the Hopper build off
/// ([`PlanPreference::allow_sm90a`](crate::PlanPreference::allow_sm90a)).
pub fn build_for_preference(cc: (u32, u32), allow_sm90a: bool) -> ArchSku {
    if allow_sm90a { build_for(cc) } else { ArchSku::Sm80 }
}

/// The PTX text of build `arch`.
pub fn of_build(arch: ArchSku) -> &'static str {
    match arch {
        ArchSku::Sm90 => PTX_SM90,
        ArchSku::Sm80 => PTX,
    }
}

/// The PTX text of [`build_for`]`(cc)`.
pub fn for_compute_capability(cc: (u32, u32)) -> &'static str {
    of_build(build_for(cc))
}

/// Whether kernels loaded from [`for_compute_capability`] support programmatic dependent launch
/// (only the sm_90 build has `griddepcontrol`).
pub fn supports_programmatic_launch(cc: (u32, u32)) -> bool {
    build_for(cc) == ArchSku::Sm90
}

/// One build's PTX cut at its entry points, so that each entry loads as a module of its own.
///
/// The driver JIT-compiles a module whole: loading the whole sm_90 build compiles all of its
/// entries (about 27 s on the H200 machines' hosts, before the driver's compute cache holds
/// them), where a plan launches a dozen. A module of one entry is the build's text outside
/// every entry (the header, the file-scope declarations, the helper functions, in their
/// order) with that entry's definition in its place. The build declares no `.global` or `.const`
/// variable ([`Self::shared_state`] is empty, a test checks it), so no state that entries would
/// share is split between modules.
#[derive(Debug, Clone)]
pub struct EntryModules<'a> {
    text: &'a str,
    /// The text in order: `None` outside every entry, `Some(name)` an entry's definition.
    parts: Vec<(Option<&'a str>, std::ops::Range<usize>)>,
}

impl<'a> EntryModules<'a> {
    /// Cuts `ptx` at its entries: an entry runs from its `.entry` line to the first line after
    /// it that is a closing brace in the first column (its body's; nested blocks are indented).
    pub fn new(text: &'a str) -> Self {
        let mut parts = Vec::new();
        let (mut start, mut entry) = (0, None);
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            let end = offset + line.len();
            match entry {
                None => {
                    if let Some(name) = entry_name(line) {
                        parts.push((None, start..offset));
                        (start, entry) = (offset, Some(name));
                    }
                }
                Some(name) => {
                    if line.trim_end() == "}" {
                        parts.push((Some(name), start..end));
                        (start, entry) = (end, None);
                    }
                }
            }
            offset = end;
        }
        // An entry without its closing brace stays in the shared text, and no module has it.
        parts.push((None, start..text.len()));
        parts.retain(|(_, r)| !r.is_empty());
        Self { text, parts }
    }

    /// The entries' names, in order of appearance.
    pub fn names(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.parts.iter().filter_map(|(name, _)| *name)
    }

    /// Each entry's name and definition (from its `.entry` line to its closing brace).
    pub fn definitions(&self) -> impl Iterator<Item = (&'a str, &'a str)> + '_ {
        let text = self.text;
        self.parts.iter().filter_map(move |(name, r)| name.map(|n| (n, &text[r.clone()])))
    }

    /// The PTX module of entry `name` alone, or `None` when the build has no such entry.
    pub fn module(&self, name: &str) -> Option<String> {
        let entry = self.parts.iter().find(|(n, _)| *n == Some(name))?.1.clone();
        let mut module = String::with_capacity(entry.len() + self.shared_len());
        for (n, range) in &self.parts {
            if n.is_none() || *range == entry {
                module.push_str(&self.text[range.clone()]);
            }
        }
        Some(module)
    }

    /// Bytes of the text outside every entry, which each module repeats.
    pub fn shared_len(&self) -> usize {
        self.parts.iter().filter(|(n, _)| n.is_none()).map(|(_, r)| r.len()).sum()
    }

    /// The lines outside every entry that declare module-scope variables (`.global`, `.const`):
    /// state each entry's module would hold a copy of.
    pub fn shared_state(&self) -> Vec<&'a str> {
        let text = self.text;
        self.parts
            .iter()
            .filter(|(n, _)| n.is_none())
            .flat_map(|(_, r)| text[r.clone()].lines())
            .filter(|line| {
                // A declaration names its state space among its leading directives.
                let directives = line.split_whitespace().take_while(|w| w.starts_with('.'));
                directives.take(3).any(|w| w == ".global" || w == ".const")
            })
            .collect()
    }
}

/// The name of the entry a line of PTX begins (`.visible .entry NAME(`, `.entry NAME(`).
fn entry_name(line: &str) -> Option<&str> {
    let rest = line.strip_prefix(".visible .entry ").or_else(|| line.strip_prefix(".entry "))?;
    let name = rest.split(['(', ' ', '\n']).next()?.trim();
    (!name.is_empty()).then_some(name)
}

/// [`EntryModules`] of build `arch`, cut once per process.
pub fn entry_modules(arch: ArchSku) -> &'static EntryModules<'static> {
    static SM80: LazyLock<EntryModules<'static>> = LazyLock::new(|| EntryModules::new(PTX));
    static SM90: LazyLock<EntryModules<'static>> = LazyLock::new(|| EntryModules::new(PTX_SM90));
    match arch {
        ArchSku::Sm90 => &SM90,
        ArchSku::Sm80 => &SM80,
    }
}

/// Names of the `.entry` functions declared in `ptx`, in order of appearance.
pub fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest).trim())
        .collect()
}

/// Entry points the host launches from the portable build ([`entry::all`]); it must provide all
/// of them, and the sm_90 build these and [`entry::sm90_only`] ([`expected_entries`]).
pub static EXPECTED_ENTRIES: LazyLock<Vec<String>> = LazyLock::new(entry::all);

/// The entry points the build of a device of compute capability `cc` must provide.
pub fn expected_entries(cc: (u32, u32)) -> Vec<String> {
    entry::of_build(cc)
}

#[cfg(test)]
mod tests {
    use super::EntryModules;

    const PTX: &str = "\
.version 7.8
.target sm_90
.address_size 64
.extern .shared .align 128 .b8 DYN_SMEM[];
.func helper
();
\t// .globl\tfirst
.visible .entry first(
\t.param .u64 first_param_0
)
{
\t{ // callseq 1
\tcall.uni helper, ();
\t}
\tret;
}
\t// .globl\tsecond
.entry second()
.maxntid 128, 1, 1
{
\tret;
}
.func helper()
{
\tret;
}
";

    #[test]
    fn each_module_is_the_shared_text_and_one_entry() {
        let modules = EntryModules::new(PTX);
        assert_eq!(modules.names().collect::<Vec<_>>(), ["first", "second"]);
        let second = modules.module("second").unwrap();
        assert!(second.starts_with(".version 7.8\n.target sm_90\n.address_size 64\n.extern .shared"));
        assert!(second.contains(".entry second()\n.maxntid 128, 1, 1\n{\n\tret;\n}\n"));
        assert!(!second.contains("first("), "{second}");
        // The helper's prototype before the entry, its definition after it, as in the build.
        assert!(second.ends_with("\t// .globl\tsecond\n.entry second()\n.maxntid 128, 1, 1\n{\n\tret;\n}\n.func helper()\n{\n\tret;\n}\n"));
        let first = modules.module("first").unwrap();
        assert!(first.contains("\tcall.uni helper, ();\n\t}\n\tret;\n}\n"), "{first}");
        assert!(!first.contains("second()"));
        // Shared text plus each entry's definition is the whole text.
        let entries: usize =
            ["first", "second"].map(|n| modules.module(n).unwrap().len() - modules.shared_len()).iter().sum();
        assert_eq!(entries + modules.shared_len(), PTX.len());
        assert!(modules.module("third").is_none());
        assert!(modules.shared_state().is_empty());
    }

    #[test]
    fn module_scope_variables_are_reported() {
        let with_state =
            PTX.replace(".func helper\n();", ".global .align 4 .u32 counter;\n.func helper\n();");
        assert_eq!(EntryModules::new(&with_state).shared_state(), [".global .align 4 .u32 counter;"]);
        // Instructions naming a state space are not declarations.
        // (in the helper's definition, outside every entry)
        let helper_body = PTX.strip_suffix("\tret;\n}\n").unwrap();
        let with_load = format!("{helper_body}\tld.global.u32 %r1, [%rd1];\n\tret;\n}}\n");
        assert!(EntryModules::new(&with_load).shared_state().is_empty());
    }

    /// Every kernel but the bench's read kernel takes one parameter block by value, the
    /// `#[repr(C)]` struct of `params.rs` the host launches it with: the blocks' sizes as the host
    /// compiles them are the byte arrays each entry of both builds declares (the `DeviceRepr`
    /// of the plans rests on it).
    #[test]
    fn every_entry_takes_the_host_parameter_block_of_its_size() {
        use crate::params::{AppendParams, DecodeParams, PageTableCheckParams};
        use std::mem::size_of;
        for (build, text) in [("sm_80", super::PTX), ("sm_90", super::PTX_SM90)] {
            let modules = EntryModules::new(text);
            let mut blocks = 0;
            for name in modules.names() {
                let module = modules.module(name).unwrap();
                let declaration = format!(".param .align 8 .b8 {name}_param_0[");
                let Some(at) = module.find(&declaration) else {
                    assert_eq!(name, "read_bandwidth", "{build} {name}: no parameter block");
                    continue;
                };
                let signature = &module[at + declaration.len()..];
                let signature = &signature[..signature.find(')').unwrap()];
                let bytes: usize = signature[..signature.find(']').unwrap()].parse().unwrap();
                assert!(!signature.contains(".param"), "{build} {name}: more than one parameter");
                let host = match name.split('_').next().unwrap() {
                    "decode" | "schedule" => size_of::<DecodeParams>(),
                    "append" => size_of::<AppendParams>(),
                    "check" => size_of::<PageTableCheckParams>(),
                    other => panic!("{build} {name}: no parameter block known for `{other}` entries"),
                };
                assert_eq!(bytes, host, "{build} {name}: the PTX's parameter block against the host's");
                blocks += 1;
            }
            assert!(blocks > 60, "{build}: {blocks} entries checked");
        }
    }

    #[test]
    fn an_unclosed_entry_has_no_module() {
        let cut = &PTX[..PTX.find("\tret;\n}\n\t// .globl\tsecond").unwrap()];
        let modules = EntryModules::new(cut);
        assert_eq!(modules.names().count(), 0);
        assert!(modules.module("first").is_none());
        assert_eq!(modules.shared_len(), cut.len());
    }
}
