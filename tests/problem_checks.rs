//! The checks every GPU test rests on, run on the CPU: the comparison with the reference
//! (`compare_request`, `compare_outputs`) rejects what a broken kernel writes, and a problem whose
//! unused store slots are poisoned has the reference of the same problem without the poison.

#[path = "../host/cli/problem.rs"]
#[allow(dead_code)]
mod problem;

use half::{bf16, f16};
use paged_decode::Element;
use paged_decode::float8::F8E4M3;
use problem::{HostProblem, ProblemCache, ProblemSpec, compare_outputs, compare_request};

/// Two requests (7 and 0 tokens) of 4 query heads over 2 KV heads, head_dim 64, 5-token pages.
fn spec() -> ProblemSpec {
    ProblemSpec { lens: vec![7, 0], spare_pages: 2, seed: 11, ..ProblemSpec::uniform(1, 0, 4, 2, 64, 5) }
}

/// The reference's rows of request `b`, and the same rounded to `T` (what a right kernel writes).
fn request<T: Element + ProblemCache>(
    host: &HostProblem<T>,
    b: usize,
) -> (Vec<f64>, Vec<f64>, Vec<T>, Vec<f32>) {
    let r = host.reference_request(b).unwrap();
    let o = r.o.iter().map(|&x| T::from_f64(x)).collect();
    let lse = r.lse.iter().map(|&x| x as f32).collect();
    (r.o, r.lse, o, lse)
}

fn rejects<T: Element + ProblemCache>() {
    let spec = spec();
    let host = HostProblem::<T>::random(&spec).unwrap();
    let (want_o, want_lse, o, lse) = request(&host, 0);
    let cmp = |o: &[T], lse: &[f32]| compare_request(&spec, 0, (o, lse), (&want_o, &want_lse));
    assert!(cmp(&o, &lse).is_ok(), "{:?}: the reference rounded to T passes", T::KIND);

    let with = |i: usize, x: f64| {
        let mut o = o.clone();
        o[i] = T::from_f64(x);
        o
    };
    assert!(cmp(&with(3, f64::NAN), &lse).is_err(), "{:?}: one NaN in o", T::KIND);
    assert!(cmp(&with(3, f64::INFINITY), &lse).is_err(), "{:?}: one inf in o", T::KIND);
    // Every element off by four times the tolerance.
    let (tol, lse_tol) = problem::tolerances(T::KIND);
    let scale = 1.0 + 4.0 * tol;
    let skewed: Vec<T> = o.iter().map(|x| T::from_f64(x.to_f64() * scale)).collect();
    assert!(cmp(&skewed, &lse).is_err(), "{:?}: o off by {:.1e}", T::KIND, scale - 1.0);

    let mut bad_lse = lse.clone();
    bad_lse[1] = f32::NAN;
    assert!(cmp(&o, &bad_lse).is_err(), "{:?}: a NaN lse", T::KIND);
    bad_lse[1] = lse[1] + 4.0 * lse_tol as f32;
    assert!(cmp(&o, &bad_lse).is_err(), "{:?}: an lse off by 4× its tolerance", T::KIND);
    assert!(cmp(&o[1..], &lse).is_err(), "{:?}: o shorter than the reference", T::KIND);
    assert!(cmp(&o, &lse[1..]).is_err(), "{:?}: lse shorter than the reference", T::KIND);

    // The empty request: o exactly 0 and lse exactly -inf.
    let (want_o, want_lse, o, lse) = request(&host, 1);
    assert!(want_lse.iter().all(|&x| x == f64::NEG_INFINITY));
    let cmp = |o: &[T], lse: &[f32]| compare_request(&spec, 1, (o, lse), (&want_o, &want_lse));
    assert!(cmp(&o, &lse).is_ok(), "{:?}: the empty request's reference passes", T::KIND);
    let tiny: Vec<T> = o.iter().map(|_| T::from_f64(1e-6)).collect();
    assert!(cmp(&tiny, &lse).is_err(), "{:?}: an empty request's o of 1e-6", T::KIND);
    let finite = vec![0f32; lse.len()];
    assert!(cmp(&o, &finite).is_err(), "{:?}: an empty request's finite lse", T::KIND);

    // The whole batch: a row of the second request left unwritten (NaN) fails it.
    let r = host.reference().unwrap();
    let o_all: Vec<T> = r.o.iter().map(|&x| T::from_f64(x)).collect();
    let lse_all: Vec<f32> = r.lse.iter().map(|&x| x as f32).collect();
    assert!(compare_outputs(&spec, &o_all, &lse_all, &r).is_ok());
    let mut unwritten = o_all.clone();
    let last = unwritten.len() - 1;
    unwritten[last] = T::from_f64(f64::NAN);
    assert!(
        compare_outputs(&spec, &unwritten, &lse_all, &r).is_err(),
        "{:?}: a NaN in the last row",
        T::KIND
    );
    assert!(
        compare_outputs(&spec, &o_all[..last], &lse_all, &r).is_err(),
        "{:?}: o shorter than the batch",
        T::KIND
    );
}

#[test]
fn comparison_rejects_wrong_outputs() {
    rejects::<f16>();
    rejects::<bf16>();
    rejects::<f32>();
}

/// Slots no request reads hold NaN, and the reference does not read them: it equals the same
/// problem's without the poison bit for bit.
fn poisoned_slots_are_unread<C: ProblemCache>() {
    for (lens, page, spare) in [(vec![7, 0, 1, 10], 5, 2), (vec![0], 16, 1), (vec![33, 16, 1], 16, 0)] {
        let plain =
            ProblemSpec { lens, spare_pages: spare, seed: 23, ..ProblemSpec::uniform(1, 0, 8, 2, 64, page) };
        let poisoned = ProblemSpec { poison_unused_slots: true, ..plain.clone() };
        let (a, b) = (
            HostProblem::<f16, C>::random(&plain).unwrap(),
            HostProblem::<f16, C>::random(&poisoned).unwrap(),
        );
        let nan = |v: &[C]| v.iter().filter(|&&x| x.value(1.0).is_nan()).count();
        let used: usize = plain.lens.iter().sum();
        let slots = a.desc.paged_kv.num_total_pages as usize * page;
        let unused = (slots - used) * plain.num_kv_heads * plain.head_dim;
        assert_eq!((nan(&a.k_data), nan(&a.v_data)), (0, 0));
        assert_eq!(
            (nan(&b.k_data), nan(&b.v_data)),
            (unused, unused),
            "{:?} lens {:?}",
            C::CACHE_KIND,
            plain.lens
        );
        let (ra, rb) = (a.reference().unwrap(), b.reference().unwrap());
        assert!(ra.o.iter().zip(&rb.o).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert!(ra.lse.iter().zip(&rb.lse).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}

#[test]
fn poisoned_slots_are_not_read_by_the_reference() {
    poisoned_slots_are_unread::<f16>();
    poisoned_slots_are_unread::<F8E4M3>();
}

/// The reference of one request over an 8-bit store (the bench's `--check`), which reads only
/// that request's pages, agrees with the whole batch's reference; under a variant or the NHD
/// layout too: a window longer than every request changes nothing.
#[test]
fn fp8_reference_of_one_request_matches_the_batch() {
    use paged_decode::KvLayout;
    use paged_decode::reference::AttentionVariant;
    let spec = ProblemSpec {
        lens: vec![70, 1, 0, 33],
        spare_pages: 3,
        seed: 5,
        ..ProblemSpec::uniform(1, 0, 8, 2, 128, 16)
    };
    let host = HostProblem::<f16, F8E4M3>::random(&spec).unwrap();
    let batch = host.reference().unwrap();
    let (row, heads) = (8 * 128, 8);
    let wide = AttentionVariant { window_left: Some(1 << 20), ..Default::default() };
    for b in 0..spec.batch() {
        let (o, lse) = (&batch.o[b * row..(b + 1) * row], &batch.lse[b * heads..(b + 1) * heads]);
        for (what, r) in [
            ("plain", host.reference_request(b).unwrap()),
            ("windowed", host.reference_request_variant(b, wide, KvLayout::Hnd).unwrap()),
        ] {
            let err = problem::rel_l2(r.o.iter().copied(), o);
            assert!(
                err < 1e-6 || (spec.lens[b] == 0 && r.o.iter().all(|&x| x == 0.0)),
                "{what} {b}: {err:.1e}"
            );
            assert!(r.lse.iter().zip(lse).all(|(a, b)| a == b || (a - b).abs() < 1e-6), "{what} {b}: lse");
        }
        let nhd = host.reference_request_variant(b, Default::default(), KvLayout::Nhd).unwrap();
        assert!(nhd.o.iter().all(|x| x.is_finite()));
    }
}
