//! Instruction mix: counts of the instructions a tuner looks at first (tensor-core MMA,
//! `ldmatrix`, `cp.async`, loads and stores by state space and width, shuffles, barriers,
//! branches, atomics), in PTX and in SASS under the same class names, so the two can be compared.

use std::collections::BTreeMap;

/// Instruction counts by class: `mma`, `ldmatrix`, `cp.async.128`, `cp.async.commit`,
/// `cp.async.wait`, `ld.global.128`, `st.shared.64`, `ld.local.32`, `ld.generic.32`, `shfl`,
/// `barrier`, `branch`, `atomic`, `call`, `prefetch`, and `total` (every instruction).
pub type Mix = BTreeMap<String, u64>;

/// The class of every instruction.
pub const TOTAL: &str = "total";

/// Columns of the summary table: a class family (widths summed) and its header.
pub const SUMMARY: &[(&str, &str)] = &[
    ("mma", "mma"),
    ("ldmatrix", "ldsm"),
    ("cp.async", "cp.as"),
    ("ld.global", "ldg"),
    ("st.global", "stg"),
    ("ld.shared", "lds"),
    ("st.shared", "sts"),
    ("shfl", "shfl"),
    ("barrier", "bar"),
    ("branch", "bra"),
    (TOTAL, "total"),
];

/// Families in display order; classes of other families follow, by name.
const FAMILY_ORDER: &[&str] = &[
    "mma",
    "ldmatrix",
    "cp.async",
    "cp.async.commit",
    "cp.async.wait",
    "ld.global",
    "st.global",
    "ld.shared",
    "st.shared",
    "ld.local",
    "st.local",
    "ld.generic",
    "st.generic",
    "atomic",
    "shfl",
    "barrier",
    "branch",
    "call",
    "prefetch",
    TOTAL,
];

/// Sort key of a class for display: family order, then width.
pub fn display_order(class: &str) -> (usize, String, u32) {
    let family_name = family(class);
    let rank = FAMILY_ORDER.iter().position(|f| *f == family_name).unwrap_or(FAMILY_ORDER.len() - 1);
    let width = class[family_name.len()..].trim_start_matches('.').parse().unwrap_or(0);
    (rank, family_name.to_string(), width)
}

/// `class n, class n, …` in display order.
pub fn one_line(mix: &Mix) -> String {
    let mut classes: Vec<(&String, &u64)> = mix.iter().collect();
    classes.sort_by_key(|(class, _)| display_order(class));
    classes.iter().map(|(class, n)| format!("{class} {n}")).collect::<Vec<_>>().join(", ")
}

/// The family of a class: the class without its width (`ld.global.128` → `ld.global`).
pub fn family(class: &str) -> &str {
    match class.rsplit_once('.') {
        Some((head, width)) if width.parse::<u32>().is_ok() => head,
        _ => class,
    }
}

/// Sum of the counts of every class of `family`.
pub fn family_count(mix: &Mix, family_name: &str) -> u64 {
    mix.iter().filter(|(class, _)| family(class) == family_name).map(|(_, n)| n).sum()
}

/// The mix of one PTX function body (directives, labels and comments are not instructions).
pub fn ptx_mix(body: &str) -> Mix {
    let mut mix = Mix::new();
    for statement in ptx_statements(body) {
        let (op, operands) = statement.split_once(char::is_whitespace).unwrap_or((statement, ""));
        *mix.entry(TOTAL.into()).or_default() += 1;
        if let Some(class) = ptx_class(op, operands.trim()) {
            *mix.entry(class).or_default() += 1;
        }
    }
    mix
}

/// The instructions of a PTX text, without predicates: each `;`-terminated statement that is
/// not a directive (`.reg`, `.loc`, …), with scope braces removed.
pub fn ptx_statements(body: &str) -> impl Iterator<Item = &str> {
    body.lines().flat_map(|line| {
        let code = line.split("//").next().unwrap_or_default();
        let mut pieces: Vec<&str> = code.split(';').collect();
        pieces.pop(); // the text after the last `;` is not a statement
        pieces.into_iter().filter_map(|piece| {
            let s = piece.trim().trim_start_matches(['{', '}']).trim_start();
            let s = match s.strip_prefix('@') {
                Some(guarded) => guarded.split_once(char::is_whitespace)?.1.trim_start(),
                None => s,
            };
            (!s.is_empty() && !s.starts_with('.')).then_some(s)
        })
    })
}

fn ptx_class(op: &str, operands: &str) -> Option<String> {
    let parts: Vec<&str> = op.split('.').collect();
    let class = match parts[0] {
        "mma" | "wgmma" => "mma".into(),
        "ldmatrix" => "ldmatrix".into(),
        "cp" if parts.get(1) != Some(&"async") => return None,
        "cp" if op.contains("commit_group") => "cp.async.commit".into(),
        "cp" if op.contains("wait_group") || op.contains("wait_all") => "cp.async.wait".into(),
        "cp" => {
            // `cp.async.cg.shared.global [dst], [src], 16, …`: the third operand is the size.
            let bytes: u32 = operands.split(',').nth(2)?.trim().parse().ok()?;
            format!("cp.async.{}", bytes * 8)
        }
        "ld" | "ldu" | "st" => {
            let space = ptx_state_space(&parts)?;
            let direction = if parts[0] == "st" { "st" } else { "ld" };
            format!("{direction}.{space}.{}", ptx_access_bits(&parts)?)
        }
        "shfl" => "shfl".into(),
        "bar" | "barrier" if parts.get(1) == Some(&"warp") => return None,
        "bar" | "barrier" => "barrier".into(),
        "bra" | "brx" => "branch".into(),
        "atom" | "red" => "atomic".into(),
        "call" => "call".into(),
        "prefetch" | "prefetchu" => "prefetch".into(),
        _ => return None,
    };
    Some(class)
}

/// `global`, `shared`, `local` or `generic`; `None` for parameter and constant space.
fn ptx_state_space(parts: &[&str]) -> Option<&'static str> {
    for part in &parts[1..] {
        for (prefix, space) in [("global", "global"), ("shared", "shared"), ("local", "local")] {
            if part.starts_with(prefix) {
                return Some(space);
            }
        }
        if part.starts_with("param") || part.starts_with("const") {
            return None;
        }
    }
    Some("generic")
}

/// Bits one thread moves: vector length (`.v2`, `.v4`, `.v8`) × element type bits.
fn ptx_access_bits(parts: &[&str]) -> Option<u32> {
    let lanes = parts.iter().find_map(|p| p.strip_prefix('v')?.parse::<u32>().ok()).unwrap_or(1);
    let element = parts.iter().rev().find_map(|p| ptx_type_bits(p))?;
    Some(lanes * element)
}

fn ptx_type_bits(ty: &str) -> Option<u32> {
    match ty {
        "f16x2" | "bf16x2" => Some(32),
        "bf16" => Some(16),
        _ => {
            let digits = ty.strip_prefix(['b', 'u', 's', 'f'])?;
            digits.parse().ok().filter(|bits| [8, 16, 32, 64, 128].contains(bits))
        }
    }
}

/// The mix of one SASS listing (`nvdisasm` or `cuobjdump -sass` lines of one function).
pub fn sass_mix(listing: &str) -> Mix {
    let mut mix = Mix::new();
    for opcode in listing.lines().filter_map(sass_opcode) {
        *mix.entry(TOTAL.into()).or_default() += 1;
        if let Some(class) = sass_class(opcode) {
            *mix.entry(class).or_default() += 1;
        }
    }
    mix
}

/// The opcode of a disassembled instruction line (`/*0c30*/ @!P0 LDG.E.128 R4, …`), without
/// its predicate; `None` for any other line.
pub fn sass_opcode(line: &str) -> Option<&str> {
    super::sass::instruction(line).map(|(opcode, _)| opcode)
}

fn sass_class(opcode: &str) -> Option<String> {
    let mut parts = opcode.split('.');
    let base = parts.next()?;
    let modifiers: Vec<&str> = parts.collect();
    let bits = || {
        let width = modifiers.iter().find_map(|m| match *m {
            "U8" | "S8" => Some(8),
            "U16" | "S16" => Some(16),
            "64" => Some(64),
            "128" => Some(128),
            _ => None,
        });
        width.unwrap_or(32)
    };
    let class = match base {
        "HMMA" | "IMMA" | "DMMA" | "BMMA" | "HGMMA" | "IGMMA" | "QGMMA" | "BGMMA" => "mma".into(),
        "LDSM" => "ldmatrix".into(),
        "LDGSTS" => format!("cp.async.{}", bits()),
        "LDGDEPBAR" => "cp.async.commit".into(),
        "DEPBAR" => "cp.async.wait".into(),
        "LDG" => format!("ld.global.{}", bits()),
        "STG" => format!("st.global.{}", bits()),
        "LDS" => format!("ld.shared.{}", bits()),
        "STS" => format!("st.shared.{}", bits()),
        "LDL" => format!("ld.local.{}", bits()),
        "STL" => format!("st.local.{}", bits()),
        "LD" => format!("ld.generic.{}", bits()),
        "ST" => format!("st.generic.{}", bits()),
        "SHFL" => "shfl".into(),
        "BAR" => "barrier".into(),
        "BRA" | "BRX" | "JMP" | "JMX" => "branch".into(),
        "ATOM" | "ATOMG" | "ATOMS" | "RED" | "REDG" => "atomic".into(),
        "CALL" => "call".into(),
        "CCTL" if modifiers.iter().any(|m| m.starts_with("PF")) => "prefetch".into(),
        _ => return None,
    };
    Some(class)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mix_of(pairs: &[(&str, u64)]) -> Mix {
        pairs.iter().map(|&(k, v)| (k.to_string(), v)).collect()
    }

    #[test]
    fn classifies_ptx_statements() {
        let body = "\
            .reg .b32 %r<4>;\n\
            $L__BB0_1:\n\
            \t// begin inline asm\n\
            \tcp.async.cg.shared.global.L2::cache_hint [%r1], [%rd2], 16, %r3, %rd4;\n\
            \tcp.async.commit_group;\n\
            \tcp.async.wait_group 1;\n\
            \tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];\n\
            \tmma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f1};\n\
            \t{ .reg .pred p; setp.ne.u32 p, %r1, 0; bar.red.or.pred p, 0, p; }\n\
            \tld.global.nc.v4.b32 {%r1, %r2, %r3, %r4}, [%rd1];\n\
            \tld.global.cg.b32 %r1, [%rd1];\n\
            \tst.shared.v2.f32 [%r1], {%f1, %f2};\n\
            \tld.param.b64 %rd1, [p0];\n\
            \tst.b16 [%rd1], %rs1;\n\
            \tld.local.b32 %r1, [%rd1];\n\
            \tshfl.sync.bfly.b32 %r1, %r2, 1, 0x1f, -1;\n\
            \tbar.sync 0;\n\
            \tbar.warp.sync -1;\n\
            \t@%p1 bra $L__BB0_1;   // loop\n\
            \t@!%p2 bra.uni $L__BB0_2;\n\
            \tatom.relaxed.gpu.global.add.u32 %r1, [%rd1], 1;\n\
            \tret;\n";
        let want = mix_of(&[
            ("cp.async.128", 1),
            ("cp.async.commit", 1),
            ("cp.async.wait", 1),
            ("ldmatrix", 1),
            ("mma", 1),
            ("barrier", 2),
            ("ld.global.128", 1),
            ("ld.global.32", 1),
            ("st.shared.64", 1),
            ("st.generic.16", 1),
            ("ld.local.32", 1),
            ("shfl", 1),
            ("branch", 2),
            ("atomic", 1),
            (TOTAL, 20),
        ]);
        assert_eq!(ptx_mix(body), want);
    }

    #[test]
    fn classifies_sass_lines() {
        let listing = "\
            .text.k:\n\
            \t//## File \"k.rs\", line 3\n\
            \x20       /*0000*/                   LDC R1, c[0x0][0x28] ;\n\
            \x20       /*0010*/              @!P0 BRA `(.L_x_1) ;\n\
            \x20       /*0020*/                   LDGSTS.E.BYPASS.LTC128B.128 [R3], desc[UR4][R4.64] ;\n\
            \x20       /*0030*/                   LDGDEPBAR ;\n\
            \x20       /*0040*/                   DEPBAR.LE SB0, 0x1 ;\n\
            \x20       /*0050*/                   LDSM.16.MT88.4 R4, [R2] ;\n\
            \x20       /*0060*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;\n\
            \x20       /*0070*/                   LDG.E.64.CONSTANT R2, desc[UR4][R2.64] ;\n\
            \x20       /*0080*/                   STS.U16 [R1], R2 ;\n\
            \x20       /*0090*/                   LDS R2, [R1] ;\n\
            \x20       /*00a0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;\n\
            \x20       /*00b0*/                   SHFL.BFLY PT, R2, R9, 0x10, 0x1f ;\n\
            \x20       /*00c0*/                   REDG.E.ADD.STRONG.GPU desc[UR4][R2.64], R5 ;\n\
            \x20       /*00d0*/                   CCTL.E.PF2 [R2] ;\n\
            \x20       /*00e0*/                   NOP;\n\
            \x20       /*0000*/ \t.byte\t0xff, 0xff\n";
        let want = mix_of(&[
            ("branch", 1),
            ("cp.async.128", 1),
            ("cp.async.commit", 1),
            ("cp.async.wait", 1),
            ("ldmatrix", 1),
            ("mma", 1),
            ("ld.global.64", 1),
            ("st.shared.16", 1),
            ("ld.shared.32", 1),
            ("barrier", 1),
            ("shfl", 1),
            ("atomic", 1),
            ("prefetch", 1),
            (TOTAL, 15),
        ]);
        assert_eq!(sass_mix(listing), want);
    }

    /// Occurrences of `needle` in `text`.
    fn occurrences(text: &str, needles: &[&str]) -> u64 {
        needles.iter().map(|n| text.matches(n).count() as u64).sum()
    }

    /// Lines of `text` holding an instruction that starts with `op` and mentions every one of
    /// `parts`.
    fn lines_with(text: &str, op: &str, parts: &[&str]) -> u64 {
        let ops = text.lines().map(|l| l.trim_start()).map(|l| match l.strip_prefix('@') {
            Some(guarded) => {
                guarded.split_once(char::is_whitespace).map_or("", |(_, rest)| rest.trim_start())
            }
            None => l,
        });
        ops.filter(|l| l.starts_with(op) && parts.iter().all(|p| l.contains(p))).count() as u64
    }

    /// On the shipped PTX, the report's classes agree with plain text counts of each entry.
    #[test]
    fn shipped_ptx_counts_agree_with_the_text() {
        use super::super::ptx_text::entry_spans;
        for ptx in [paged_decode::ptx::PTX, paged_decode::ptx::PTX_SM90] {
            for span in entry_spans(ptx) {
                let (mix, text) = (ptx_mix(span.text), span.text);
                let got = |class: &str| match family(class) == class {
                    true => family_count(&mix, class),
                    false => mix.get(class).copied().unwrap_or(0),
                };
                let expected = [
                    ("mma", occurrences(text, &["mma.sync.aligned."])),
                    ("ldmatrix", occurrences(text, &["ldmatrix.sync.aligned."])),
                    ("cp.async", occurrences(text, &["cp.async.cg.", "cp.async.ca."])),
                    ("cp.async.commit", occurrences(text, &["cp.async.commit_group"])),
                    ("cp.async.wait", occurrences(text, &["cp.async.wait_group", "cp.async.wait_all"])),
                    ("shfl", occurrences(text, &["shfl.sync."])),
                    ("barrier", occurrences(text, &["bar.sync", "bar.red.", "barrier.", "bar.arrive"])),
                    ("branch", lines_with(text, "bra", &[])),
                    ("atomic", lines_with(text, "atom.", &[]) + lines_with(text, "red.", &[])),
                    ("ld.global", lines_with(text, "ld.", &[".global."])),
                    ("st.global", lines_with(text, "st.", &[".global."])),
                    ("ld.shared", lines_with(text, "ld.", &[".shared."])),
                    ("st.shared", lines_with(text, "st.", &[".shared."])),
                    ("ld.global.128", lines_with(text, "ld.", &[".global.", ".v4."])),
                    ("st.global.128", lines_with(text, "st.", &[".global.", ".v4."])),
                    ("ld.shared.128", lines_with(text, "ld.", &[".shared.", ".v4."])),
                    ("st.shared.128", lines_with(text, "st.", &[".shared.", ".v4."])),
                ];
                for (class, want) in expected {
                    assert_eq!(got(class), want, "{}: `{class}`", span.name);
                }
                assert!(got("mma") > 0 || !span.name.starts_with("decode_mma"), "{}: no mma", span.name);
            }
        }
    }

    #[test]
    fn families_sum_the_widths() {
        let mix =
            mix_of(&[("ld.global.128", 3), ("ld.global.32", 2), ("cp.async.commit", 5), ("cp.async.128", 7)]);
        assert_eq!(family_count(&mix, "ld.global"), 5);
        assert_eq!(family_count(&mix, "cp.async"), 7);
        assert_eq!(family_count(&mix, "cp.async.commit"), 5);
    }
}
