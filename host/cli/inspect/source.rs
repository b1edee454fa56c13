//! Source mapping. Built from source with `PAGED_DECODE_PTX_LINEINFO=1`, the PTX carries `.loc` line
//! directives, each commented by llc with the calls it was inlined through
//! (`.loc 7 312 9 // src/decode.rs:312:9 @[ src/lib.rs:33:1 ]`). That maps every PTX
//! instruction, and through ptxas `-lineinfo` and `nvdisasm -gp` (SASS → PTX line) every SASS
//! instruction, to a chain of Rust source lines, which a region (a function or a line range)
//! selects from.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::{Component, Path, PathBuf};

use super::mix::{self, Mix};
use super::ptx_text::EntrySpan;

/// Why `--source` cannot work on this build, and how to fix it.
pub const NO_LINE_INFO: &str = "the embedded PTX has no line info; build it from source with line info \
     (`PAGED_DECODE_BUILD_PTX=1 PAGED_DECODE_PTX_LINEINFO=1 cargo run --release -- inspect --source ENTRY`; keep \
     both variables set on every cargo command, or the next build embeds the shipped PTX again)";

/// One source position: absolute path and 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Absolute path when the PTX's `.file` table names it, else the path as llc printed it.
    pub file: String,
    /// Line, 1-based; 0 means no particular line.
    pub line: u32,
}

/// Where an instruction comes from: innermost first, then the call sites it was inlined into.
pub type Chain = Vec<Frame>;

/// The line info of one PTX text.
pub struct LineInfo {
    /// `(0-based line of the .loc, chain)`, in text order.
    locs: Vec<(usize, Chain)>,
    /// The `.file` table: `(id, path)`.
    files: Vec<(u32, String)>,
}

impl LineInfo {
    /// Parses the `.file` and `.loc` directives of `ptx`; `None` without line info.
    pub fn parse(ptx: &str) -> Option<Self> {
        let mut file_ids: HashMap<u32, String> = HashMap::new();
        let mut raw_locs: Vec<(usize, u32, u32, &str)> = Vec::new();
        for (number, line) in ptx.lines().enumerate() {
            let (directive, rest) = line.trim_start().split_once(char::is_whitespace).unwrap_or_default();
            if directive == ".file" {
                let mut words = rest.split_whitespace();
                let id = words.next().and_then(|w| w.parse().ok());
                let path = rest.split('"').nth(1);
                if let (Some(id), Some(path)) = (id, path) {
                    file_ids.insert(id, path.to_string());
                }
            } else if directive == ".loc" {
                let (directive, comment) = rest.split_once("//").unwrap_or((rest, ""));
                let mut words = directive.split_whitespace().map(|w| w.parse::<u32>().ok());
                if let (Some(Some(file)), Some(Some(at))) = (words.next(), words.next()) {
                    raw_locs.push((number, file, at, comment.trim()));
                }
            }
        }
        if raw_locs.is_empty() {
            return None;
        }
        let mut files: Vec<(u32, String)> = file_ids.iter().map(|(id, path)| (*id, path.clone())).collect();
        files.sort();
        let mut info = Self { locs: Vec::new(), files };
        for (number, file_id, line, comment) in raw_locs {
            let file = file_ids.get(&file_id).cloned().unwrap_or_else(|| format!("file {file_id}"));
            let mut chain = vec![Frame { file, line }];
            chain.extend(comment.split("@[").skip(1).filter_map(|frame| info.frame(frame)));
            info.locs.push((number, chain));
        }
        Some(info)
    }

    /// A frame of llc's comment, `src/lib.rs:33:1 ]`.
    fn frame(&self, text: &str) -> Option<Frame> {
        let mut parts = text.trim().trim_end_matches([']', ' ']).trim().rsplitn(3, ':');
        let (_column, line, path) = (parts.next()?, parts.next()?.parse().ok()?, parts.next()?);
        Some(Frame { file: self.resolve(path).unwrap_or_else(|| path.to_string()), line })
    }

    /// The `.file` path ending in `relative` (llc prints paths relative to the crate), preferring
    /// one outside the Rust library.
    fn resolve(&self, relative: &str) -> Option<String> {
        let tail = format!("/{relative}");
        let candidates =
            || self.files.iter().map(|(_, f)| f).filter(|f| f.ends_with(&tail) || *f == relative);
        candidates().find(|f| !is_library(f)).or_else(|| candidates().next()).cloned()
    }

    /// The chain of the last `.loc` at or before 0-based `line`.
    pub fn chain_at(&self, line: usize) -> Option<&Chain> {
        let after = self.locs.partition_point(|(at, _)| *at <= line);
        after.checked_sub(1).map(|i| &self.locs[i].1)
    }

    /// Files of the kernel crate (not the Rust library) named by the `.file` table.
    fn crate_files(&self) -> impl Iterator<Item = &String> {
        self.files.iter().map(|(_, f)| f).filter(|f| !is_library(f))
    }
}

/// Whether `path` is in the Rust library sources (`core`, `stdarch`).
fn is_library(path: &str) -> bool {
    path.contains("/rustlib/src/rust/library/") || path.starts_with("/rustc/")
}

/// A file and an inclusive range of lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineRange {
    /// Path, or its tail (`decode.rs`): matches any path ending in it.
    pub file: String,
    /// First line.
    pub first: u32,
    /// Last line.
    pub last: u32,
}

impl LineRange {
    fn contains(&self, frame: &Frame) -> bool {
        let file_matches = frame.file == self.file || frame.file.ends_with(&format!("/{}", self.file));
        file_matches && (self.first..=self.last).contains(&frame.line)
    }
}

/// The lines a region names: `FILE:FIRST-LAST`, `FILE:LINE`, `FILE` (a path or its tail,
/// e.g. `decode.rs:300-360`) or the name of a function in the kernel crate (`fn NAME`, from its
/// signature to its closing brace).
pub fn parse_region(spec: &str, info: &LineInfo) -> Result<Vec<LineRange>, String> {
    let (file, lines) = spec.split_once(':').unwrap_or((spec, ""));
    if file.ends_with(".rs") {
        let number = |n: &str| n.trim().parse::<u32>().map_err(|_| bad_region(spec));
        let (first, last) = match lines.split_once('-') {
            _ if lines.is_empty() => (1, u32::MAX),
            Some((a, b)) => (number(a)?, number(b)?),
            None => (number(lines)?, number(lines)?),
        };
        if first > last {
            return Err(bad_region(spec));
        }
        return Ok(vec![LineRange { file: file.to_string(), first, last }]);
    }
    if !spec.chars().all(|c| c.is_alphanumeric() || c == '_') || spec.is_empty() {
        return Err(bad_region(spec));
    }
    let ranges: Vec<LineRange> = info
        .crate_files()
        .filter_map(|path| Some((path, std::fs::read_to_string(path).ok()?)))
        .flat_map(|(path, text)| {
            function_ranges(&text, spec).into_iter().map(move |(first, last)| (path, first, last))
        })
        .map(|(path, first, last)| LineRange { file: path.clone(), first, last })
        .collect();
    if ranges.is_empty() {
        let files: Vec<&str> = info.crate_files().map(String::as_str).collect();
        return Err(format!("no `fn {spec}` in the kernel sources the PTX names ({})", files.join(", ")));
    }
    Ok(ranges)
}

fn bad_region(spec: &str) -> String {
    format!("region `{spec}`: expected FILE.rs:FIRST-LAST, FILE.rs:LINE, FILE.rs or a function name")
}

/// `(first, last)` lines (1-based) of every `fn name` in `text`: from the signature to the
/// brace that closes its body.
fn function_ranges(text: &str, name: &str) -> Vec<(u32, u32)> {
    let lines: Vec<&str> = text.lines().collect();
    let declares = |line: &str| {
        let code = line.split("//").next().unwrap_or_default();
        code.match_indices("fn ").any(|(i, _)| {
            let before_ok = i == 0 || !code.as_bytes()[i - 1].is_ascii_alphanumeric();
            let rest = &code[i + 3..];
            before_ok && rest.strip_prefix(name).is_some_and(|after| after.starts_with(['(', '<']))
        })
    };
    let mut ranges = Vec::new();
    for (start, _) in lines.iter().enumerate().filter(|(_, l)| declares(l)) {
        let mut depth = 0i64;
        let mut opened = false;
        for (offset, line) in lines[start..].iter().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for c in code.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth <= 0 {
                ranges.push((start as u32 + 1, (start + offset) as u32 + 1));
                break;
            }
        }
    }
    ranges
}

/// An instruction or a label of a listing, with the chain it comes from.
pub enum Item<'a> {
    /// A basic-block label (`$L__BB3_7:`, `.L_x_12:`), printed before the next selected
    /// instruction.
    Label(&'a str),
    /// An instruction line and where it comes from.
    Instruction(&'a str, Option<&'a Chain>),
}

/// The PTX of `span` as listing items, with the chains `info` gives each instruction.
pub fn ptx_items<'a>(span: &EntrySpan<'a>, info: &'a LineInfo) -> Vec<Item<'a>> {
    let mut items = Vec::new();
    for (offset, line) in span.text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("$L__BB") && trimmed.ends_with(':') {
            items.push(Item::Label(line));
        } else if mix::ptx_statements(line).next().is_some() {
            items.push(Item::Instruction(line, info.chain_at(span.first_line + offset)));
        }
    }
    items
}

/// The SASS of one function (nvdisasm `-gp` output) as listing items: each instruction gets
/// the chain of the PTX line nvdisasm names for it.
pub fn sass_items<'a>(listing: &'a str, info: &'a LineInfo) -> Vec<Item<'a>> {
    const PTX_LINE: &str = "//## File \".nv_debug_ptx_txt\", line ";
    let mut items = Vec::new();
    let mut chain = None;
    for line in listing.lines() {
        let trimmed = line.trim();
        if let Some(n) = trimmed.strip_prefix(PTX_LINE).and_then(|n| n.trim().parse::<usize>().ok()) {
            chain = n.checked_sub(1).and_then(|ptx_line| info.chain_at(ptx_line));
        } else if trimmed.starts_with(".L_") && trimmed.ends_with(':') {
            items.push(Item::Label(line));
        } else if mix::sass_opcode(line).is_some() {
            items.push(Item::Instruction(line, chain));
        }
    }
    items
}

/// The items whose chain touches `region` (all without one), each run headed by its chain and
/// the source line it comes from, `…` where instructions are left out; and the selected
/// instruction lines.
pub fn annotate(items: &[Item<'_>], region: Option<&[LineRange]>) -> (String, String) {
    let mut sources = SourceCache::default();
    let (mut text, mut selected) = (String::new(), String::new());
    let mut label: Option<&str> = None;
    let mut last_chain: Option<&Chain> = None;
    let mut skipped = false;
    for item in items {
        let (line, chain) = match item {
            Item::Label(l) => {
                label = Some(l);
                continue;
            }
            Item::Instruction(line, chain) => (*line, *chain),
        };
        let touches = |ranges: &[LineRange]| {
            chain.is_some_and(|c| c.iter().any(|f| ranges.iter().any(|r| r.contains(f))))
        };
        if !region.is_none_or(touches) {
            (label, skipped) = (None, true);
            continue;
        }
        if std::mem::take(&mut skipped) && !selected.is_empty() {
            text.push_str("        …\n");
            last_chain = None;
        }
        if chain != last_chain {
            text.push_str(&sources.header(chain));
            last_chain = chain;
        }
        if let Some(l) = label.take() {
            let _ = writeln!(text, "{l}");
        }
        let _ = writeln!(text, "{line}");
        let _ = writeln!(selected, "{line}");
    }
    (text, selected)
}

/// Source files read so far, for the text of the lines the headers name.
#[derive(Default)]
struct SourceCache {
    files: HashMap<String, Option<Vec<String>>>,
}

impl SourceCache {
    fn line(&mut self, frame: &Frame) -> Option<&str> {
        let lines = self.files.entry(frame.file.clone()).or_insert_with(|| {
            std::fs::read_to_string(&frame.file).ok().map(|t| t.lines().map(str::to_string).collect())
        });
        let index = (frame.line as usize).checked_sub(1)?;
        lines.as_ref()?.get(index).map(|l| l.trim())
    }

    /// `// decode.rs:312 ← lib.rs:33` and the text of the innermost line in the kernel crate.
    fn header(&mut self, chain: Option<&Chain>) -> String {
        let Some(chain) = chain.filter(|c| !c.is_empty()) else {
            return "    // (no line info)\n".into();
        };
        let places: Vec<String> =
            chain.iter().map(|f| format!("{}:{}", display_path(&f.file), f.line)).collect();
        let mut s = format!("    // {}\n", places.join(" ← "));
        let ours = chain.iter().find(|f| !is_library(&f.file)).unwrap_or(&chain[0]);
        if let Some(text) = self.line(ours) {
            let _ = writeln!(s, "    //     {text}");
        }
        s
    }
}

/// A path for headers: relative to the working directory when under it, from the library
/// root for the Rust library (`core/src/cmp.rs`), else as is.
fn display_path(path: &str) -> String {
    if let Some((_, tail)) = path.split_once("/rustlib/src/rust/library/") {
        return normalize(Path::new(tail)).display().to_string();
    }
    let cwd = std::env::current_dir().unwrap_or_default();
    Path::new(path).strip_prefix(&cwd).map_or_else(|_| path.to_string(), |p| p.display().to_string())
}

/// `a/b/../../c` → `c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The source view of one entry's PTX or SASS listing, with the count and mix of what the
/// region selected.
pub fn render(title: &str, items: &[Item<'_>], region: Option<&[LineRange]>, sass: bool) -> String {
    let mix_of = |lines: &str| if sass { mix::sass_mix(lines) } else { mix::ptx_mix(lines) };
    let count = |mix: &Mix| mix.get(mix::TOTAL).copied().unwrap_or(0);
    let all: String = items
        .iter()
        .filter_map(|item| match item {
            Item::Instruction(line, _) => Some(format!("{line}\n")),
            Item::Label(_) => None,
        })
        .collect();
    let (mut s, selected) = annotate(items, region);
    let mix = mix_of(&selected);
    let _ = writeln!(s, "\n{title}: {} of {} instructions selected", count(&mix), count(&mix_of(&all)));
    if count(&mix) > 0 {
        let _ = writeln!(s, "mix of the selection: {}", mix::one_line(&mix));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
.visible .entry k(
)
{
$L__BB0_1:
\t.loc\t2 10 5                          // src/decode.rs:10:5 @[ src/lib.rs:3:1 ]
\tld.global.nc.b32 %r1, [%rd1];
\t.loc\t3 20 9                          // src/ptr/mod.rs:20:9 @[ src/decode.rs:11:7 @[ src/lib.rs:3:1 ] ]
\tst.global.b32 [%rd1], %r1;
\t.loc\t1 4 1                           // src/lib.rs:4:1
\tret;
}
\t.file\t1 \"/w/kernels-gpu/src/lib.rs\"
\t.file\t2 \"/w/kernels-gpu/src/decode.rs\"
\t.file\t3 \"/t/lib/rustlib/src/rust/library/core/src/ptr/mod.rs\"
";

    #[test]
    fn maps_instructions_to_their_inlining_chains() {
        let info = LineInfo::parse(PTX).unwrap();
        let chain = info.chain_at(7).unwrap();
        let places: Vec<(&str, u32)> = chain.iter().map(|f| (f.file.as_str(), f.line)).collect();
        assert_eq!(
            places,
            [
                ("/t/lib/rustlib/src/rust/library/core/src/ptr/mod.rs", 20),
                ("/w/kernels-gpu/src/decode.rs", 11),
                ("/w/kernels-gpu/src/lib.rs", 3)
            ]
        );
        assert!(info.chain_at(3).is_none());
        assert!(LineInfo::parse(".visible .entry k()\n{\n\tret;\n}\n").is_none());
    }

    #[test]
    fn a_region_selects_the_instructions_inlined_through_it() {
        let info = LineInfo::parse(PTX).unwrap();
        let span = super::super::ptx_text::find_entry(PTX, "k").unwrap();
        let items = ptx_items(&span, &info);
        let decode = parse_region("decode.rs:11", &info).unwrap();
        let (text, selected) = annotate(&items, Some(&decode));
        assert_eq!(selected, "\tst.global.b32 [%rd1], %r1;\n");
        assert!(text.contains("core/src/ptr/mod.rs:20 ← "), "{text}");
        let view = render("k", &items, Some(&decode), false);
        assert!(view.contains("k: 1 of 3 instructions selected"), "{view}");
        let (all, _) = annotate(&items, None);
        assert!(all.contains("$L__BB0_1:") && all.contains("ret;"), "{all}");
        assert_eq!(parse_region("decode.rs", &info).unwrap()[0].last, u32::MAX);
        assert!(parse_region("decode.rs:9-x", &info).is_err());
        assert!(parse_region("no such thing!", &info).is_err());
        assert!(parse_region("missing_fn", &info).unwrap_err().contains("no `fn missing_fn`"));
    }

    #[test]
    fn finds_function_bodies() {
        let text = "fn a() {}\n\npub fn load_tile<T>(x: u32) -> u32 {\n    if x { 1 } else { 2 }\n}\n// fn load_tile(\nfn load_tile_2() {}\n";
        assert_eq!(function_ranges(text, "load_tile"), [(3, 5)]);
        assert_eq!(function_ranges(text, "a"), [(1, 1)]);
    }

    #[test]
    fn sass_lines_map_through_the_ptx_line() {
        let info = LineInfo::parse(PTX).unwrap();
        let listing = "\t//## File \".nv_debug_ptx_txt\", line 8\n        /*0000*/   STG.E desc[UR4][R2.64], R5 ;\n\
                       .L_x_1:\n\t//## File \".nv_debug_ptx_txt\", line 10\n        /*0010*/   EXIT ;\n";
        let items = sass_items(listing, &info);
        let region = parse_region("lib.rs:4", &info).unwrap();
        let view = render("k", &items, Some(&region), true);
        assert!(view.contains(".L_x_1:") && view.contains("EXIT ;") && !view.contains("STG"), "{view}");
        assert!(view.contains("k: 1 of 2 instructions selected"), "{view}");
    }
}
