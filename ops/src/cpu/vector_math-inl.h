// The vectorised math behind vector_math.cpp and vector_math_half.cpp: the
// transcendental kernels (exp, log, tanh, sigmoid, gelu on one vector) and
// the loop every unary function shares (ForEachVector, WithBody, ApplyT).
// No include guard: each of those files includes it once per SIMD target
// (Highway's foreach_target.h re-includes the file), inside that target's
// namespace dtensor::cpu::vmath::HWY_NAMESPACE, after <hwy/highway.h>,
// <hwy/contrib/math/math-inl.h>, <hwy/cache_control.h>, strided_copy.h,
// <cstdint>, <limits> and <type_traits>, with hn = hwy::HWY_NAMESPACE.
//
// Built from Highway's contrib/math (documented there: exp 1 ULP, log 4 ULP,
// tanh 4 ULP): exp is its polynomial behind a leaner reduction (ExpCore),
// with Highway's Exp for the vectors that reach the range ends; f32 log is
// Cephes' polynomial without a division (LogNormal), Highway's Log at the ends
// (subnormals; x < 0 -> NaN, 0 -> -inf, +inf, NaN fixed up here);
// f64 tanh is its Tanh, f32 tanh is TanhF32 below. Highway 1.0.3 has no
// erf: gelu's is below (GeluCentral, GeluErfc). Every fast path that covers only
// part of the range selects per lane, so a lane's result never depends on
// its neighbours. The measured bounds are in tests/test_vector_math.cpp.

// exp(hi + lo) where the result is a normal number (hi + lo in [-87, 88]
// for f32, [-708, 709] for f64), lo a correction too small to move the
// rounding of hi + lo to an integer multiple of ln 2 by more than one. The
// usual reduction, r = hi + lo - n ln2 (ln 2 in two parts, so that n*ln2's
// first part is exact: Cody and Waite), with Highway's polynomials for
// e^r - 1 on |r| <= ln2/2 (its ExpImpl, 1 ULP), and 2^n from n's bits: n is
// rounded by adding 1.5 * 2^23 (2^52), which leaves it in the low mantissa
// bits, so no float-to-int conversion (and its overflow fixups) is needed.
// About half the instructions of Highway's Exp, which also handles the
// range ends; ExpFull falls back to it for vectors with lanes outside.
struct NoLo {};  // ExpCore of a single value: no correction to add

template <class D, class V, class Lo>
HWY_INLINE V ExpCore(D d, V hi, Lo lo) {
  using T = hn::TFromD<D>;
  constexpr bool f32 = sizeof(T) == 4;
  const hn::RebindToSigned<D> di;
  using TI = hn::TFromD<decltype(di)>;
  const V magic = hn::Set(d, T(f32 ? 12582912.0 : 6755399441055744.0));
  constexpr bool has_lo = !std::is_same_v<Lo, NoLo>;
  V sum = hi;
  if constexpr (has_lo) sum = hn::Add(hi, lo);
  const V t = hn::MulAdd(sum, hn::Set(d, T(1.442695040888963407359924681)), magic);
  const V n = hn::Sub(t, magic);
  V r = hn::MulAdd(n, hn::Set(d, T(f32 ? -0.693145751953125 : -0.6931471805596629565116018)), hi);
  r = hn::MulAdd(n, hn::Set(d, T(f32 ? -1.428606765330187045e-6 : -0.28235290563031577122588448175e-12)), r);
  if constexpr (has_lo) r = hn::Add(r, lo);
  V p;
  if constexpr (f32) {
    p = hn::MulAdd(hn::impl::Estrin(r, hn::Set(d, 0.5f), hn::Set(d, 0.166666671633720397949219f),
                                    hn::Set(d, 0.0416664853692054748535156f), hn::Set(d, 0.00833336077630519866943359f),
                                    hn::Set(d, 0.00139304355252534151077271f),
                                    hn::Set(d, 0.000198527617612853646278381f)),
                   hn::Mul(r, r), r);
  } else {
    p = hn::MulAdd(hn::impl::Estrin(r, hn::Set(d, 0.5), hn::Set(d, 0.166666666666666851703837),
                                    hn::Set(d, 0.0416666666666665047591422), hn::Set(d, 0.00833333333331652721664984),
                                    hn::Set(d, 0.00138888888889774492207962), hn::Set(d, 0.000198412698960509205564975),
                                    hn::Set(d, 2.4801587159235472998791e-5), hn::Set(d, 2.75572362911928827629423e-6),
                                    hn::Set(d, 2.75573911234900471893338e-7), hn::Set(d, 2.51112930892876518610661e-8),
                                    hn::Set(d, 2.08860621107283687536341e-9)),
                   hn::Mul(r, r), r);
  }
  const auto biased = hn::Add(hn::BitCast(di, t), hn::Set(di, TI(f32 ? 127 : 1023)));
  constexpr int kMantissaBits = f32 ? 23 : 52;
  const V scale = hn::BitCast(d, hn::ShiftLeft<kMantissaBits>(biased));
  return hn::MulAdd(p, scale, scale);
}

template <class D, class V>
HWY_INLINE auto ExpCoreRange(D d, V x) {
  using T = hn::TFromD<D>;
  constexpr bool f32 = sizeof(T) == 4;
  return hn::And(hn::Ge(x, hn::Set(d, T(f32 ? -87.0 : -708.0))), hn::Le(x, hn::Set(d, T(f32 ? 88.0 : 709.0))));
}

// exp over the whole range, for the vectors ExpCore cannot take: Highway's
// Exp is valid up to 104 (f32) / 706 (f64), gives subnormals below, and maps
// NaN to 0. Above ln(max) the result is +inf; f64's (705, 709.78] is
// computed as exp(x/2)^2 (at most one more ULP).
template <class D, class V>
HWY_NOINLINE V ExpEnds(D d, V x) {
  using T = hn::TFromD<D>;
  constexpr bool f32 = sizeof(T) == 4;
  const V overflow = hn::Set(d, T(f32 ? 88.75 : 709.79));
  V y = hn::Exp(d, x);
  if constexpr (!f32) {
    const auto high = hn::Gt(x, hn::Set(d, T(705)));
    const V h = hn::Exp(d, hn::Mul(x, hn::Set(d, T(0.5))));
    y = hn::IfThenElse(high, hn::Mul(h, h), y);
  }
  y = hn::IfThenElse(hn::Gt(x, overflow), hn::Set(d, std::numeric_limits<T>::infinity()), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

template <class D, class V>
HWY_INLINE V ExpFull(D d, V x) {
  // The slow vectors select per lane, so that a lane's result never depends
  // on its neighbours (a sharded op must equal the unsharded one bit for bit).
  const auto fast = ExpCoreRange(d, x);
  const V core = ExpCore(d, x, NoLo{});
  if (HWY_LIKELY(hn::AllTrue(d, fast))) return core;
  return hn::IfThenElse(fast, core, ExpEnds(d, x));
}

// 1/x for finite x of normal size: f32 refines the hardware's approximate
// reciprocal (14 bits on AVX-512, 12 on SSE/AVX2) with one Newton step,
// r + r*(1 - x*r), within about one ULP and far cheaper than a division
// (on AVX-512 a division occupies its port for several cycles per vector);
// f64 has no such instruction in Highway 1.0.3 and divides.
template <class D, class V>
HWY_INLINE V Recip(D d, V x) {
  using T = hn::TFromD<D>;
  const V one = hn::Set(d, T(1));
  if constexpr (sizeof(T) == 4) {
    const V r = hn::ApproximateReciprocal(x);
    return hn::MulAdd(r, hn::NegMulAdd(x, r, one), r);
  } else {
    return hn::Div(one, x);
  }
}

// log of a positive normal f32 without a division: x = 2^e * m with m in
// [sqrt2/2, sqrt2) (musl's split of the bits, as Highway's Log), f = m - 1
// (exact), and log(1 + f) = f + f^2 (f P(f) - 1/2), P of degree 8: Cephes'
// logf (Moshier; it documents a relative error of 7.6e-8 on that range).
// Highway's Log forms (m - 1)/(m + 1) and a polynomial in its square: the
// division (or a reciprocal refined by a Newton step) and the Horner chain
// behind it made the loop latency-bound; P here is evaluated in Estrin's
// scheme (a chain of 4 operations from f where Horner's has 8). Measured over every
// 17th float of [0.5, 2) and every 997th positive normal (the dense test
// in tests/test_vector_math.cpp): 0.89 ULP with FMA, 0.86 without; Highway's
// method with the Newton reciprocal: 0.93-0.98. f64 keeps Highway's Log.
template <class D, class V>
HWY_INLINE V LogNormal(D d, V x) {
  using T = hn::TFromD<D>;
  if constexpr (sizeof(T) != 4) {
    return hn::impl::Log<D, V, /*kAllowSubnormals=*/false>(d, x);
  } else {
    const hn::RebindToSigned<D> di;
    const hn::RebindToUnsigned<D> du;
    const auto bits = hn::Add(hn::BitCast(di, x), hn::Set(di, 0x3F800000 - 0x3F3504F3));
    const V e =
        hn::ConvertTo(d, hn::Sub(hn::BitCast(di, hn::ShiftRight<23>(hn::BitCast(du, bits))), hn::Set(di, 0x7F)));
    const V m = hn::BitCast(d, hn::Add(hn::And(bits, hn::Set(di, 0x7FFFFF)), hn::Set(di, 0x3F3504F3)));
    const V f = hn::Sub(m, hn::Set(d, 1.0f));
    const V f2 = hn::Mul(f, f);
    const V f4 = hn::Mul(f2, f2);
    // P(f) = c0 + c1 f + ... + c8 f^8 as (c0 + c1 f) + f^2 (c2 + c3 f) + f^4 ((c4 + c5 f) + f^2 (c6 + c7 f) + f^4 c8).
    const V p01 = hn::MulAdd(hn::Set(d, -2.4999993993E-1f), f, hn::Set(d, 3.3333331174E-1f));
    const V p23 = hn::MulAdd(hn::Set(d, -1.6668057665E-1f), f, hn::Set(d, 2.0000714765E-1f));
    const V p45 = hn::MulAdd(hn::Set(d, -1.2420140846E-1f), f, hn::Set(d, 1.4249322787E-1f));
    const V p67 = hn::MulAdd(hn::Set(d, -1.1514610310E-1f), f, hn::Set(d, 1.1676998740E-1f));
    const V p4_8 = hn::MulAdd(hn::Set(d, 7.0376836292E-2f), f4, hn::MulAdd(p67, f2, p45));
    const V p = hn::MulAdd(p4_8, f4, hn::MulAdd(p23, f2, p01));
#if HWY_NATIVE_FMA
    // f + f^2 (f P(f) - 1/2), then + e ln 2 in the same rounding: ln 2 in one
    // part, 1.9e-9 off, which is 2.4e-7 at e = +-126, 0.03 ULP of the result
    // there, and at most 0.06 ULP where e ln 2 and log m nearly cancel (e = -1,
    // m near sqrt2).
    const V t = hn::Mul(f2, hn::MulAdd(p, f, hn::Set(d, -0.5f)));
    return hn::MulAdd(e, hn::Set(d, 0.693147182464599609375f), hn::Add(f, t));
#else
    // Without FMA e * ln 2 would round on its own: the two parts of Cephes,
    // e * the first exact, the second added to the small terms.
    const V w = hn::MulAdd(f2, hn::Set(d, -0.5f), hn::Mul(e, hn::Set(d, -2.12194440e-4f)));
    const V t = hn::MulAdd(hn::Mul(f2, f), p, w);
    return hn::MulAdd(e, hn::Set(d, 0.693359375f), hn::Add(f, t));
#endif
  }
}

// The vectors with a lane that is not a positive normal: such lanes take
// Highway's Log (subnormals scaled) and the ends' fixups; the normal lanes
// keep LogNormal's value, as among normal neighbours.
template <class D, class V>
HWY_NOINLINE V LogEnds(D d, V x) {
  using T = hn::TFromD<D>;
  const V zero = hn::Zero(d);
  const V inf = hn::Set(d, std::numeric_limits<T>::infinity());
  const auto normal = hn::And(hn::Ge(x, hn::Set(d, std::numeric_limits<T>::min())),
                              hn::Le(x, hn::Set(d, std::numeric_limits<T>::max())));
  V y = hn::IfThenElse(normal, LogNormal(d, x), hn::Log(d, x));
  y = hn::IfThenElse(hn::Eq(x, zero), hn::Neg(inf), y);
  y = hn::IfThenElse(hn::Eq(x, inf), inf, y);
  y = hn::IfThenElse(hn::Lt(x, zero), hn::Set(d, std::numeric_limits<T>::quiet_NaN()), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

// Vectors of positive normal numbers (nearly all) skip the subnormal scaling
// and the fixups of the ends.
template <class D, class V>
HWY_INLINE V LogFull(D d, V x) {
  using T = hn::TFromD<D>;
  const auto normal = hn::And(hn::Ge(x, hn::Set(d, std::numeric_limits<T>::min())),
                              hn::Le(x, hn::Set(d, std::numeric_limits<T>::max())));
  if (HWY_LIKELY(hn::AllTrue(d, normal))) return LogNormal(d, x);
  return LogEnds(d, x);
}

// 1 + erf(x / sqrt(2)) = erfc(-x / sqrt(2)), accurate relative to itself
// also where it is tiny (x << 0), so that gelu(x) = x/2 * (1 + erf(x/sqrt2))
// keeps its relative accuracy for negative x instead of cancelling. With
// a = |x| / sqrt(2): erfc(a) = t * exp(-a^2 + Q(t)), t = 1/(1 + a/2), Q of
// degree 9: Numerical Recipes' erfcc (Press et al., 2nd ed., section 6.2),
// whose relative error is < 1.2e-7 for every a >= 0; then 1 + erf is
// erfc(a) for x < 0 and 2 - erfc(a) for x >= 0 (erfc(a) <= 1 there, so its
// error stays below 1.2e-7 of a result >= 1). The exponent -a^2 = -x^2/2 is
// formed from x, not from a rounded x/sqrt(2), and exactly: with FMA, x^2 =
// p + err with p = x*x rounded and err = fma(x, x, -p) exact; without, x =
// xh + xl with xh's low 12 bits cleared, so xh^2 is exact, and x^2 - xh^2 =
// xl*(x + xh); the two parts go to ExpCore. (Rounding x/sqrt(2), or -a^2 +
// Q as one float, would cost a relative error of a^2 * 2^-23: 150 ULP near
// x = -13.) x = +-inf gives 2 and 0 (|x| is clamped to 20 sqrt(2), where
// erfc is 0 in f32), so gelu(-inf) = -inf * 0 = NaN, as the std:: formula
// gives. (Folding gelu's 1/2 into Q's constant, as -ln 2, saves a multiply
// but makes erfc/2 subnormal from x = -13.1 on and 8 ULP there.) f32 only:
// for f64 these bounds are too loose (f64 gelu stays on std::erf,
// pointwise_kernels.cpp).
template <class D, class V>
HWY_INLINE V GeluErfc(D d, V x) {
  const V one = hn::Set(d, 1.0f);
  const V half = hn::Set(d, 0.5f);
  const V xa = hn::Min(hn::Abs(x), hn::Set(d, 28.2842712f));
  // 1 + a/2 in one rounding: a = xa / sqrt(2) is not needed on its own.
  // Without FMA the Newton step of Recip rounds 1 - x*r on its own (an ULP
  // more in t, which erfc is proportional to): those targets divide.
  const V den = hn::MulAdd(xa, hn::Set(d, 0.35355339059327376f), one);
#if HWY_NATIVE_FMA
  const V t = Recip(d, den);
#else
  const V t = hn::Div(one, den);
#endif
  V q = hn::Set(d, 0.17087277f);
  q = hn::MulAdd(q, t, hn::Set(d, -0.82215223f));
  q = hn::MulAdd(q, t, hn::Set(d, 1.48851587f));
  q = hn::MulAdd(q, t, hn::Set(d, -1.13520398f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.27886807f));
  q = hn::MulAdd(q, t, hn::Set(d, -0.18628806f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.09678418f));
  q = hn::MulAdd(q, t, hn::Set(d, 0.37409196f));
  q = hn::MulAdd(q, t, hn::Set(d, 1.00002368f));
  q = hn::MulAdd(q, t, hn::Set(d, -1.26551223f));
#if HWY_NATIVE_FMA
  const V sq = hn::Mul(xa, xa);
  const V head = hn::Mul(hn::Neg(half), sq);                      // exact
  const V rest = hn::NegMulAdd(half, hn::MulSub(xa, xa, sq), q);  // the product's exact error
#else
  const hn::RebindToUnsigned<D> du;
  const V xh = hn::BitCast(d, hn::And(hn::BitCast(du, xa), hn::Set(du, 0xFFFFF000u)));
  const V xl = hn::Sub(xa, xh);
  const V head = hn::Mul(hn::Neg(half), hn::Mul(xh, xh));  // exact
  const V rest = hn::NegMulAdd(hn::Mul(half, xl), hn::Add(xa, xh), q);
#endif
  // One exp of the exact sum (see ExpCore); where that leaves ExpCore's
  // range, per lane, the product of the two parts' exps. Only the low end
  // can be left: head <= 0 and Q < 0.2. NaN (if Min kept it) fails the test.
  // For x < 0, gelu = (x/2 * t) * e: x/2 * t before the exp, whose result
  // is normal where ExpCore is used, so the one rounding that can fall among
  // the subnormals is the last (t * e first is subnormal from x = -13.1 on,
  // 8 ULP there); the lanes below take (x/2 * t * e^rest) * e^head.
  const V hx = hn::Mul(half, x);
  const V hxt = hn::Mul(hx, t);
  const auto fast = hn::Ge(hn::Add(head, rest), hn::Set(d, -87.0f));
  const V e = ExpCore(d, head, rest);
  V erfc = hn::Mul(t, e);
  V neg = hn::Mul(hxt, e);
  if (HWY_UNLIKELY(!hn::AllTrue(d, fast))) {
    const V eh = ExpFull(d, head), er = ExpFull(d, rest);
    erfc = hn::IfThenElse(fast, erfc, hn::Mul(t, hn::Mul(eh, er)));
    neg = hn::IfThenElse(fast, neg, hn::Mul(hn::Mul(hxt, er), eh));
  }
  return hn::IfThenElse(hn::Gt(x, hn::Zero(d)), hn::Mul(hx, hn::Sub(hn::Set(d, 2.0f), erfc)), neg);
}

// gelu(x) for |x| < kGeluCentralEnd, where nearly all activations lie: the
// same erfc(a) = exp(-a^2 + log erfcx(a)) as above (a = |x|/sqrt2), but on
// this bounded range log erfcx is a polynomial in |x| (L below, degree 9,
// fitted to |L error| <= 3.4e-8 with its f32 coefficients; evaluated, 2e-7),
// so no reciprocal, no t and one exp specialised to its argument: it lies in
// [-7.7, 0], so no range ends, and n*ln2hi (n in [-12, 0], ln2hi of 15 bits)
// is exact, which lets one FMA form -x^2/2 - n*ln2hi exactly and round it
// once (|.| < 2: 6e-8) instead of splitting x^2. e^r on |r| <= ln2/2 is a
// degree-6 polynomial (relative error 7e-8 with f32 Horner), 2^n comes from
// t's bits (the magic constant carries the exponent bias). Then gelu =
// max(x, 0) - |x|/2 * erfc(a): one rounding, exact in sign (x86's max
// returns its second operand for +-0, so gelu(-0) = -0). Without FMA
// -x^2/2 rounds on its own (2^-25 |x|^2 relative to the result) and every
// MulAdd rounds twice, so those targets take it only below 1.5 (there the
// erfc formula's Q(t) would cancel: 10.6 ULP near x = -0.06), where it
// stays within the bound.
constexpr float kGeluCentralEnd = HWY_NATIVE_FMA ? 3.5f : 1.5f;

template <class D, class V>
HWY_INLINE V GeluCentral(D d, V x, V u) {
  const hn::RebindToSigned<D> di;
  V q = hn::Set(d, 2.769506580e-07f);
  q = hn::MulAdd(q, u, hn::Set(d, -5.420453363e-06f));
  q = hn::MulAdd(q, u, hn::Set(d, 4.443208309e-05f));
  q = hn::MulAdd(q, u, hn::Set(d, -1.723026799e-04f));
  q = hn::MulAdd(q, u, hn::Set(d, -3.599699994e-05f));
  q = hn::MulAdd(q, u, hn::Set(d, 4.853923805e-03f));
  q = hn::MulAdd(q, u, hn::Set(d, -3.637387604e-02f));
  q = hn::MulAdd(q, u, hn::Set(d, 1.816999316e-01f));
  q = hn::MulAdd(q, u, hn::Set(d, -7.978854179e-01f));
  q = hn::Mul(q, u);  // L(u) = log erfcx(u / sqrt2), L(0) = 0
  const V mhu = hn::Mul(hn::Set(d, -0.5f), u);
  const V magic = hn::Set(d, 12582912.0f + 127.0f);
  const V t = hn::MulAdd(hn::MulAdd(mhu, u, q), hn::Set(d, 1.442695040888963407f), magic);
  const V n = hn::Sub(t, magic);
  V r = hn::MulAdd(mhu, u, hn::Mul(n, hn::Set(d, -0.693145751953125f)));  // exact, then rounded once
  r = hn::Add(r, hn::MulAdd(n, hn::Set(d, -1.428606765330187045e-6f), q));
  V p = hn::Set(d, 1.381373149e-03f);
  p = hn::MulAdd(p, r, hn::Set(d, 8.369124494e-03f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.166842625e-02f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.666651666e-01f));
  p = hn::MulAdd(p, r, hn::Set(d, 4.999999404e-01f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  const V scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t)));
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR
  const V pos = hn::Max(hn::Zero(d), x);
#else
  const V pos = hn::IfThenZeroElse(hn::Lt(x, hn::Zero(d)), x);
#endif
  return hn::MulAdd(hn::Mul(mhu, scale), p, pos);
}

template <class D, class V>
HWY_INLINE V Gelu(D d, V x) {
  const V u = hn::Abs(x);
  const auto central = hn::Lt(u, hn::Set(d, kGeluCentralEnd));  // NaN: false
  const V y = GeluCentral(d, x, u);
  if (HWY_LIKELY(hn::AllTrue(d, central))) return y;
  return hn::IfThenElse(central, y, GeluErfc(d, x));  // per lane, as ExpFull
}

// 1/(1 + exp(-x)): the reciprocal of a denominator that can be huge (or
// +inf, giving 0) takes the exact division, in the lanes that have one.
template <class D, class V>
HWY_INLINE V RecipOnePlusExpNeg(D d, V x) {
  using T = hn::TFromD<D>;
  const V den = hn::Add(hn::Set(d, T(1)), ExpFull(d, hn::Neg(x)));
  const auto fast = hn::Lt(den, hn::Set(d, T(1e30)));
  const V r = Recip(d, den);
  if (HWY_LIKELY(hn::AllTrue(d, fast))) return r;
  return hn::IfThenElse(fast, r, hn::Div(hn::Set(d, T(1)), den));  // per lane, as ExpFull
}

// tanh in f32: an odd polynomial below 0.625, x + x^3 P(x^2) with P of
// degree 4 fitted as erf's above (relative error <= 4.8e-9 on [0, 0.625]);
// above, sign(x) * (1 - 1/((exp(2|x|) + 1)/2)), where the subtraction loses
// at most one bit (the result is >= 0.55), |x| clamped to 20 (tanh = 1 in
// f32 from 9.01). Cheaper than Highway's Tanh (expm1 and a division); f64
// uses that one. Both paths run for every lane (random signs and sizes mix
// them in every vector), so the loop is bound by its count of operations
// (and, less, by its longest chain): the doubling of |x| is folded into the
// exp polynomial's coefficients (a polynomial in h = r/2, Estrin's scheme)
// and the halving of exp(2|x|) + 1 into its power of two, and the
// reciprocal is a division: correctly rounded, and on AVX-512 it runs
// beside the FMAs where the approximate one and its Newton step take three
// of their slots.
template <class D, class V>
HWY_INLINE V TanhF32(D d, V x) {
  const hn::RebindToSigned<D> di;
  const V one = hn::Set(d, 1.0f);
  const V a = hn::Abs(x);
  const V s = hn::Mul(x, x);
  V p = hn::Set(d, -0.005691919159401061f);
  p = hn::MulAdd(p, s, hn::Set(d, 0.020626234300064595f));
  p = hn::MulAdd(p, s, hn::Set(d, -0.05373530185916289f));
  p = hn::MulAdd(p, s, hn::Set(d, 0.13331381158733235f));
  p = hn::MulAdd(p, s, hn::Set(d, -0.33333279201449856f));
  const V small_abs = hn::MulAdd(hn::Mul(a, s), p, a);
  // exp(2|x|) for 2|x| in [0, 40] as 2^n e^(2h), h = |x| - n ln2/2: gelu's
  // degree-6 e^r (relative 7e-8; 1 - 2/(e + 1) divides its error by at least
  // 2 here) at r = 2h, each coefficient c_k times 2^k (exact). The power of
  // two is 2^(n-1) (bias 126), which halves exp(2|x|) exactly, so that with
  // + 1/2 in the same FMA the division gives 2/(exp(2|x|) + 1) directly.
  const V ac = hn::Min(a, hn::Set(d, 20.0f));
  const V magic = hn::Set(d, 12582912.0f + 126.0f);
  const V t = hn::MulAdd(ac, hn::Set(d, 2.0f * 1.442695040888963407f), magic);
  const V n = hn::Sub(t, magic);
#if HWY_NATIVE_FMA
  // ln 2/2 rounded to f32 is 9.5e-10 off: n times that moves e = 2^n e^(2h)
  // by a relative 1.9e-9 n, and tanh by 2e/(e + 1)^2 <= 2/e = 2^(1-n) of
  // that: at most 0.03 ULP. One FMA rounds n * c + |x| once.
  const V h = hn::MulAdd(n, hn::Set(d, -0.34657359027997264f), ac);
#else
  // Without FMA n * c rounds on its own: ln 2/2 in gelu's two parts (halved
  // exactly), the first exact in n * it.
  V h = hn::MulAdd(n, hn::Set(d, -0.5f * 0.693145751953125f), ac);
  h = hn::MulAdd(n, hn::Set(d, -0.5f * 1.428606765330187045e-6f), h);
#endif
  const V h2 = hn::Mul(h, h);
  const V q01 = hn::MulAdd(hn::Set(d, 2.0f), h, one);
  const V q23 = hn::MulAdd(hn::Set(d, 8.0f * 1.666651666e-01f), h, hn::Set(d, 4.0f * 4.999999404e-01f));
  const V q45 = hn::MulAdd(hn::Set(d, 32.0f * 8.369124494e-03f), h, hn::Set(d, 16.0f * 4.166842625e-02f));
  const V q = hn::MulAdd(hn::MulAdd(hn::MulAdd(hn::Set(d, 64.0f * 1.381373149e-03f), h2, q45), h2, q23), h2, q01);
  const V half_den = hn::MulAdd(q, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, t))), hn::Set(d, 0.5f));
  const V large_abs = hn::Sub(one, hn::Div(one, half_den));
  // NaN fails the comparison and takes the polynomial, which keeps it NaN
  // (the clamp in the exp's argument may not): no separate NaN select.
  const V y = hn::IfThenElse(hn::Ge(a, hn::Set(d, 0.625f)), large_abs, small_abs);
  return hn::Or(y, hn::And(hn::SignBit(d), x));  // tanh is odd, -0 included
}

template <class D, class V>
HWY_INLINE V Eval(D d, Fn fn, V x) {
  using T = hn::TFromD<D>;
  const V one = hn::Set(d, T(1));
  switch (fn) {
    case Fn::Exp: return ExpFull(d, x);
    case Fn::Log: return LogFull(d, x);
    case Fn::Tanh:
      if constexpr (sizeof(T) == 4)
        return TanhF32(d, x);
      else
        return hn::IfThenElse(hn::IsNaN(x), x, hn::Tanh(d, x));
    case Fn::Sigmoid: return RecipOnePlusExpNeg(d, x);
    case Fn::Silu: return hn::Mul(x, RecipOnePlusExpNeg(d, x));
    case Fn::Sqrt: return hn::Sqrt(x);
    case Fn::Relu: return hn::IfThenZeroElse(hn::Lt(x, hn::Zero(d)), x);  // NaN and -0 stay
    case Fn::Rsqrt: return hn::Div(one, hn::Sqrt(x));
    case Fn::Gelu:
      if constexpr (sizeof(T) == 4) return Gelu(d, x);
      break;
  }
  return x;  // unreachable: f64 gelu is computed by apply() before dispatch
}

// Outputs of kStreamStoreBytes and more are written with streaming stores.
using dtensor::cpu::kStreamStoreBytes;

// The loop every function shares: whole vectors, then the tail through a
// padded buffer (its unused lanes are zeros; no FP exception is unmasked).
// Big outputs stream from the first vector-aligned element on.
template <class T, class Body>
HWY_INLINE void ForEachVector(const T* x, T* y, std::int64_t n, Body body) {
  const hn::ScalableTag<T> d;
  const std::int64_t N = static_cast<std::int64_t>(hn::Lanes(d));
  std::int64_t i = 0;
  auto tail = [&](std::int64_t from, std::int64_t to) {
    HWY_ALIGN T buf[hn::MaxLanes(d)] = {};
    for (std::int64_t j = from; j < to; ++j) buf[j - from] = x[j];
    hn::Store(body(d, hn::Load(d, buf)), d, buf);
    for (std::int64_t j = from; j < to; ++j) y[j] = buf[j - from];
  };
  if (n * static_cast<std::int64_t>(sizeof(T)) >= kStreamStoreBytes) {
    const auto misaligned = reinterpret_cast<std::uintptr_t>(y) % (N * sizeof(T));
    if (misaligned % sizeof(T) == 0 && misaligned != 0) {
      i = N - static_cast<std::int64_t>(misaligned / sizeof(T));
      tail(0, i);
    }
    if (misaligned % sizeof(T) == 0) {
      for (; i + N <= n; i += N) hn::Stream(body(d, hn::LoadU(d, x + i)), d, y + i);
      hwy::FlushStream();
    }
  }
  for (; i + N <= n; i += N) hn::StoreU(body(d, hn::LoadU(d, x + i)), d, y + i);
  if (i < n) tail(i, n);
}

// Calls loop(body) with fn's body: one switch per array, not per vector,
// each case its own loop. The body is forced inline: left to GCC, whether
// gelu's (the biggest) is inlined or called once per vector (spilling around
// the call) changed with unrelated code elsewhere in this file, and cost
// gelu 1.25-1.35x.
template <class Loop>
HWY_INLINE void WithBody(Fn fn, Loop loop) {
  switch (fn) {
#define DTENSOR_VMATH_CASE(F) \
  case Fn::F: return loop([](auto d, auto v) __attribute__((always_inline)) { return Eval(d, Fn::F, v); });
    DTENSOR_VMATH_CASE(Exp)
    DTENSOR_VMATH_CASE(Log)
    DTENSOR_VMATH_CASE(Tanh)
    DTENSOR_VMATH_CASE(Sigmoid)
    DTENSOR_VMATH_CASE(Silu)
    DTENSOR_VMATH_CASE(Gelu)
    DTENSOR_VMATH_CASE(Sqrt)
    DTENSOR_VMATH_CASE(Rsqrt)
    DTENSOR_VMATH_CASE(Relu)
#undef DTENSOR_VMATH_CASE
  }
}

template <class T>
HWY_NOINLINE void ApplyT(Fn fn, const T* x, T* y, std::int64_t n) {
  WithBody(fn, [&](auto body) { ForEachVector(x, y, n, body); });
}
