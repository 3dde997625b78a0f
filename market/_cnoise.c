/* The compiled noise step (noise format v2, docs/protocol.md §1): request keys (SHAKE256),
 * main words (ChaCha20, RFC 8439) and the discrete Laplace decisions of many value-steps in one
 * call. market/_step.py is its only caller and keeps the numpy reference beside it.
 *
 * Portable C11, no dependency but Python's own headers (no numpy headers: arrays travel as
 * buffers), so an install builds it wherever a C compiler exists. Floating-point expressions are
 * written in the order market/_dlap.py evaluates them and built with -ffp-contract=off (no
 * fused multiply-add), so every decision is computed with the same roundings as the reference;
 * libm's log1p may differ from numpy's by ulps, which the margins cover (a decided outcome is
 * the exact outcome either way).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ Keccak-f[1600], SHAKE256 */
static const uint64_t RC[24] = {
    0x0000000000000001ULL, 0x0000000000008082ULL, 0x800000000000808aULL, 0x8000000080008000ULL,
    0x000000000000808bULL, 0x0000000080000001ULL, 0x8000000080008081ULL, 0x8000000000008009ULL,
    0x000000000000008aULL, 0x0000000000000088ULL, 0x0000000080008009ULL, 0x000000008000000aULL,
    0x000000008000808bULL, 0x800000000000008bULL, 0x8000000000008089ULL, 0x8000000000008003ULL,
    0x8000000000008002ULL, 0x8000000000000080ULL, 0x000000000000800aULL, 0x800000008000000aULL,
    0x8000000080008081ULL, 0x8000000000008080ULL, 0x0000000080000001ULL, 0x8000000080008008ULL};
/* The rho rotations and pi lane order of the standard compact formulation (FIPS 202 §3.2). */
static const int ROTC[24] = {1,  3,  6,  10, 15, 21, 28, 36, 45, 55, 2,  14,
                             27, 41, 56, 8,  25, 43, 62, 18, 39, 61, 20, 44};
static const int PILN[24] = {10, 7,  11, 17, 18, 3, 5,  16, 8,  21, 24, 4,
                             15, 23, 19, 13, 12, 2, 20, 14, 22, 9,  6,  1};

#define ROL64(x, n) (((x) << (n)) | ((x) >> (64 - (n))))

/* Every loop has a constant trip count: unrolled, each index and rotation is a constant. */
#if defined(__GNUC__)
#define UNROLL _Pragma("GCC unroll 24")
#else
#define UNROLL
#endif

/* Append index i to the list of undecided coordinates; -1 (with the exception set) on failure. */
static int append_index(PyObject *list, Py_ssize_t i) {
    PyObject *k = PyLong_FromSsize_t(i);
    if (k == NULL) return -1;
    const int r = PyList_Append(list, k);
    Py_DECREF(k);
    return r;
}

static void keccak_f(uint64_t st[25]) {
    uint64_t bc[5], t;
    for (int round = 0; round < 24; round++) {
        UNROLL for (int i = 0; i < 5; i++) bc[i] = st[i] ^ st[i + 5] ^ st[i + 10] ^ st[i + 15] ^ st[i + 20];
        UNROLL for (int i = 0; i < 5; i++) {
            t = bc[(i + 4) % 5] ^ ROL64(bc[(i + 1) % 5], 1);
            UNROLL for (int j = 0; j < 25; j += 5) st[j + i] ^= t;
        }
        t = st[1];
        UNROLL for (int i = 0; i < 24; i++) {
            int j = PILN[i];
            bc[0] = st[j];
            st[j] = ROL64(t, ROTC[i]);
            t = bc[0];
        }
        UNROLL for (int j = 0; j < 25; j += 5) {
            UNROLL for (int i = 0; i < 5; i++) bc[i] = st[j + i];
            UNROLL for (int i = 0; i < 5; i++) st[j + i] ^= (~bc[(i + 1) % 5]) & bc[(i + 2) % 5];
        }
        st[0] ^= RC[round];
    }
}

#define SHAKE256_RATE 136

typedef struct {
    uint64_t a[25];
    size_t pos; /* bytes absorbed into the current block */
} sponge;

static void sponge_absorb(sponge *s, const unsigned char *data, size_t len) {
    while (len > 0) {
        if ((s->pos & 7) == 0 && len >= 8) { /* a whole lane, little-endian */
            uint64_t lane = 0;
            for (int k = 7; k >= 0; k--) lane = lane << 8 | data[k];
            s->a[s->pos >> 3] ^= lane;
            s->pos += 8;
            data += 8;
            len -= 8;
        } else {
            s->a[s->pos >> 3] ^= (uint64_t)*data++ << (8 * (s->pos & 7));
            s->pos++;
            len--;
        }
        if (s->pos == SHAKE256_RATE) {
            keccak_f(s->a);
            s->pos = 0;
        }
    }
}

/* The first 32 bytes of the output (one block: 32 < rate). */
static void sponge_digest32(sponge *s, unsigned char out[32]) {
    s->a[s->pos >> 3] ^= (uint64_t)0x1F << (8 * (s->pos & 7));
    s->a[(SHAKE256_RATE - 1) >> 3] ^= (uint64_t)0x80 << (8 * ((SHAKE256_RATE - 1) & 7));
    keccak_f(s->a);
    for (int i = 0; i < 32; i++) out[i] = (unsigned char)(s->a[i >> 3] >> (8 * (i & 7)));
}

/* ------------------------------------------------------------------------ ChaCha20 (RFC 8439) */
#define ROL32(x, n) (((x) << (n)) | ((x) >> (32 - (n))))
#define QR(a, b, c, d)                                                                     \
    a += b; d ^= a; d = ROL32(d, 16); c += d; b ^= c; b = ROL32(b, 12);                   \
    a += b; d ^= a; d = ROL32(d, 8);  c += d; b ^= c; b = ROL32(b, 7);

static uint32_t load32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Block ``counter`` of the keystream of ``key`` with a zero 96-bit nonce, as 8 u64 words. */
static void chacha_block(const uint32_t key[8], uint32_t counter, uint64_t out[8]) {
    uint32_t in[16] = {0x61707865, 0x3320646e, 0x79622d32, 0x6b206574, key[0], key[1],
                       key[2],     key[3],     key[4],     key[5],     key[6], key[7],
                       counter,    0,          0,          0};
    uint32_t x[16];
    memcpy(x, in, sizeof x);
    for (int i = 0; i < 10; i++) {
        QR(x[0], x[4], x[8], x[12]) QR(x[1], x[5], x[9], x[13])
        QR(x[2], x[6], x[10], x[14]) QR(x[3], x[7], x[11], x[15])
        QR(x[0], x[5], x[10], x[15]) QR(x[1], x[6], x[11], x[12])
        QR(x[2], x[7], x[8], x[13]) QR(x[3], x[4], x[9], x[14])
    }
    for (int i = 0; i < 8; i++)
        out[i] = (uint64_t)(x[2 * i] + in[2 * i]) | (uint64_t)(x[2 * i + 1] + in[2 * i + 1]) << 32;
}

/* ----------------------------------------------------------------------------- helpers */
/* The sizes of a sequence of non-negative ints, into a new C array (NULL with an error set). */
static Py_ssize_t *read_sizes(PyObject *seq, Py_ssize_t *count, Py_ssize_t *total) {
    PyObject *fast = PySequence_Fast(seq, "sizes must be a sequence of ints");
    if (fast == NULL) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    Py_ssize_t *out = PyMem_Malloc(sizeof(Py_ssize_t) * (m ? m : 1));
    if (out == NULL) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return NULL;
    }
    *total = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        Py_ssize_t v = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
        if (v < 0) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a size is negative");
            PyMem_Free(out);
            Py_DECREF(fast);
            return NULL;
        }
        out[i] = v;
        *total += v;
    }
    Py_DECREF(fast);
    *count = m;
    return out;
}

/* The joined main words of ``m`` request keys into ``words`` (slots rows of ``total``). */
static void fill_words(const unsigned char *keys, const Py_ssize_t *sizes, Py_ssize_t m,
                       Py_ssize_t total, Py_ssize_t slots, uint64_t *words) {
    Py_ssize_t offset = 0;
    for (Py_ssize_t i = 0; i < m; i++) {
        uint32_t key[8];
        for (int k = 0; k < 8; k++) key[k] = load32(keys + 32 * i + 4 * k);
        Py_ssize_t n = sizes[i], count = n * slots;
        uint64_t block[8];
        uint64_t *row = words + offset; /* slot s of coordinate j: row s, column offset + j */
        for (Py_ssize_t w = 0, j = 0; w < count; w++) {
            if ((w & 7) == 0) chacha_block(key, (uint32_t)(w >> 3), block);
            row[j] = block[w & 7];
            if (++j == n) {
                j = 0;
                row += total;
            }
        }
        offset += n;
    }
}

/* --------------------------------------------------------------------------- request_keys */
PyDoc_STRVAR(request_keys_doc,
             "request_keys(head, seeds) -> bytes\n\n"
             "SHAKE256(head || seed), first 32 bytes, for each seed, concatenated.");

static PyObject *request_keys(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer head;
    PyObject *seeds;
    if (!PyArg_ParseTuple(args, "y*O", &head, &seeds)) return NULL;
    PyObject *fast = PySequence_Fast(seeds, "seeds must be a sequence of bytes");
    if (fast == NULL) {
        PyBuffer_Release(&head);
        return NULL;
    }
    Py_ssize_t m = PySequence_Fast_GET_SIZE(fast);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 32 * m);
    if (out == NULL) goto done;
    sponge base = {{0}, 0};
    sponge_absorb(&base, head.buf, (size_t)head.len);
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *seed = PySequence_Fast_GET_ITEM(fast, i);
        if (!PyBytes_Check(seed)) {
            PyErr_SetString(PyExc_TypeError, "a seed must be bytes");
            Py_CLEAR(out);
            goto done;
        }
        sponge s = base;
        sponge_absorb(&s, (const unsigned char *)PyBytes_AS_STRING(seed),
                      (size_t)PyBytes_GET_SIZE(seed));
        sponge_digest32(&s, dst + 32 * i);
    }
done:
    Py_DECREF(fast);
    PyBuffer_Release(&head);
    return out;
}

/* ----------------------------------------------------------------------------- main_words */
PyDoc_STRVAR(main_words_doc,
             "main_words(keys, sizes, slots) -> bytearray\n\n"
             "The joined main words of the request keys (32 bytes each): slot s of coordinate j\n"
             "of request i (word s*sizes[i] + j of its stream) at row s, column offset_i + j,\n"
             "as native uint64 (slots rows of sum(sizes) words).");

static PyObject *main_words(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer keys;
    PyObject *sizes_obj;
    Py_ssize_t slots;
    if (!PyArg_ParseTuple(args, "y*On", &keys, &sizes_obj, &slots)) return NULL;
    Py_ssize_t m = 0, total = 0;
    Py_ssize_t *sizes = read_sizes(sizes_obj, &m, &total);
    PyObject *out = NULL;
    if (sizes == NULL) goto done;
    if (keys.len != 32 * m || slots < 0) {
        PyErr_SetString(PyExc_ValueError, "main_words needs 32 bytes of key per size");
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(8 * slots * total));
    if (out == NULL) goto done;
    fill_words((const unsigned char *)keys.buf, sizes, m, total, slots,
               (uint64_t *)PyByteArray_AS_STRING(out));
done:
    PyMem_Free(sizes);
    PyBuffer_Release(&keys);
    return out;
}

/* ---------------------------------------------------------------------------- keyed_words */
PyDoc_STRVAR(keyed_words_doc,
             "keyed_words(head, seeds, sizes, slots) -> (bytes, bytearray)\n\n"
             "request_keys(head, seeds) and main_words of those keys, in one call.");

static PyObject *keyed_words(PyObject *self, PyObject *args) {
    PyObject *head, *seeds, *sizes_obj;
    Py_ssize_t slots;
    if (!PyArg_ParseTuple(args, "OOOn", &head, &seeds, &sizes_obj, &slots)) return NULL;
    PyObject *pair = Py_BuildValue("(OO)", head, seeds);
    if (pair == NULL) return NULL;
    PyObject *keys = request_keys(self, pair);
    Py_DECREF(pair);
    if (keys == NULL) return NULL;
    Py_ssize_t m = 0, total = 0;
    Py_ssize_t *sizes = read_sizes(sizes_obj, &m, &total);
    PyObject *words = NULL, *result = NULL;
    if (sizes == NULL) goto done;
    if (PyBytes_GET_SIZE(keys) != 32 * m || slots < 0) {
        PyErr_SetString(PyExc_ValueError, "keyed_words needs one size per seed");
        goto done;
    }
    words = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)(8 * slots * total));
    if (words == NULL) goto done;
    fill_words((const unsigned char *)PyBytes_AS_STRING(keys), sizes, m, total, slots,
               (uint64_t *)PyByteArray_AS_STRING(words));
    result = PyTuple_Pack(2, keys, words);
done:
    Py_DECREF(keys);
    Py_XDECREF(words);
    PyMem_Free(sizes);
    return result;
}

/* -------------------------------------------------------------------------- dlap_segments */
#define U53 (1.0 / 9007199254740992.0) /* 2^-53 */
#define G_MAX 4503599627370496.0       /* 2^52 */

PyDoc_STRVAR(dlap_segments_doc,
             "dlap_segments(words, consts, sizes, margin, eta, libm_error=0.0)\n"
             "    -> (bytearray, list)\n\n"
             "market._dlap.sample_segments' float pass: words are the joined two-slot draws\n"
             "(2 rows of sum(sizes) uint64), consts four doubles per segment (k_l, k_l + k_0,\n"
             "total, 1/s_q). Returns the int64 noise and the indices left undecided.\n"
             "libm_error (a test hook) multiplies every log1p result by 1 + libm_error: a\n"
             "platform whose log1p is off by that much.");

static PyObject *dlap_segments(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words, consts;
    PyObject *sizes_obj;
    double margin, eta, libm_error = 0.0;
    if (!PyArg_ParseTuple(args, "y*y*Odd|d", &words, &consts, &sizes_obj, &margin, &eta,
                          &libm_error))
        return NULL;
    Py_ssize_t m = 0, n = 0;
    PyObject *out = NULL, *undecided = NULL, *result = NULL;
    Py_ssize_t *sizes = read_sizes(sizes_obj, &m, &n);
    if (sizes == NULL) goto done;
    if (words.len != 16 * n || consts.len != 32 * m) {
        PyErr_SetString(PyExc_ValueError, "dlap_segments: words or constants of the wrong size");
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    undecided = PyList_New(0);
    if (out == NULL || undecided == NULL) goto done;
    const uint64_t *w1 = (const uint64_t *)words.buf, *w2 = w1 + n;
    const double *cst = (const double *)consts.buf;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    Py_ssize_t i = 0;
    for (Py_ssize_t seg = 0; seg < m; seg++) {
        const double c1 = cst[4 * seg], c2 = cst[4 * seg + 1], total = cst[4 * seg + 2],
                     inv_s = cst[4 * seg + 3];
        /* _choose_part (per-coordinate total, two thresholds, the second worth 3) */
        const double mm = total * margin, hi_off = mm + total * U53;
        for (Py_ssize_t end = i + sizes[seg]; i < end; i++) {
            const double u = (double)(w1[i] >> 11) * U53;
            const double x = u * total, lo = x - mm, hi = x + hi_off;
            const int part = (lo >= c1) + 3 * (lo >= c2);
            const int part_hi = (hi > c1) + 3 * (hi > c2);
            int und = part != part_hi;
            /* _floor_exponential(u2, 1/s, None, eta, inverse=True) */
            const double arg = (double)(w2[i] >> 11) * U53 * 1.0;
            double e = log1p(-arg);
            if (libm_error != 0.0) e *= 1.0 + libm_error;
            e *= -1.0;
            const double de = (2.0 * U53 * 1.0) / (1.0 - arg);
            double x_lo = e * inv_s;
            x_lo *= 1.0 - eta;
            double x_hi = e + de;
            x_hi *= inv_s;
            x_hi *= 1.0 + eta;
            if (x_lo > G_MAX) x_lo = G_MAX; /* np.minimum: x_lo is never NaN */
            const double g = floor(x_lo);
            const int und_g = floor(x_hi) != g || x_hi >= G_MAX || arg > 1.0 - 2.0 * U53;
            und |= und_g && part != 1;
            const int64_t g1 = (int64_t)g + 1;
            o[i] = part == 4 ? g1 : (part == 0 ? -g1 : 0);
            if (und) {
                if (append_index(undecided, i) < 0) {
                    goto done;
                }
            }
        }
    }
    result = PyTuple_Pack(2, out, undecided);
done:
    Py_XDECREF(out);
    Py_XDECREF(undecided);
    PyMem_Free(sizes);
    PyBuffer_Release(&words);
    PyBuffer_Release(&consts);
    return result;
}

/* -------------------------------------------------------------------- Gaussian float pass */
/* Every loop of this section is branch-free per coordinate (selects, no libm calls), so the
 * compiler vectorises it; on x86-64 with GCC 11 or later and glibc it is also built for AVX-512
 * and AVX2, glibc picking the clone for the CPU at load time (IEEE operations round the same in
 * every width, and -ffp-contract=off keeps fused multiply-adds out: the same doubles on every
 * path). */
#if defined(__GNUC__) && __GNUC__ >= 11 && !defined(__clang__) && defined(__x86_64__) && \
    defined(__GLIBC__)
#define SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#define SIMD_CLONES_ON 1
#else
#define SIMD_CLONES
#endif

PyDoc_STRVAR(wide_doc,
             "wide() -> bool\n\n"
             "Whether the Gaussian pass runs vectorised on this CPU: x86-64 needs AVX-512 (its\n"
             "64-bit integer conversions; the AVX2 and baseline builds run them one by one, at\n"
             "~3x numpy's time per coordinate), arm64 always has them.");

static PyObject *wide(PyObject *self, PyObject *noargs) {
    (void)self;
    (void)noargs;
#if defined(SIMD_CLONES_ON)
    __builtin_cpu_init();
    const int ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                   __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512cd");
    return PyBool_FromLong(ok);
#elif defined(__aarch64__) || (defined(__AVX512F__) && defined(__AVX512DQ__))
    Py_RETURN_TRUE;
#else
    Py_RETURN_FALSE;
#endif
}

#if defined(_MSC_VER) && !defined(__STDC_VERSION__)
#define restrict __restrict
#endif

#define LN2_HI 0x1.62e42fee00000p-1 /* ln 2 to 32 bits: k * LN2_HI is exact for |k| < 2^20 */
#define LN2_LO 0x1.a39ef35793c76p-33
#define SQRT2 0x1.6a09e667f3bcdp+0

/* ln u for a double u in (0, 1], within 2^-49 relative (the float pass trusts 2^-46, TAU).
 * u = 2^k m with m in [1/√2, √2) (bits, no libm), ln m = 2 atanh(s), s = (m - 1)/(m + 1),
 * |s| < 0.1716, by its series to s^21 (the tail is below 2^-60). m - 1 is exact (Sterbenz),
 * s within 2 ulps, the Horner sum 1 + s²/3 + ... within 3 and 2s times it within 1 more: ln m
 * within 2^-50 relative. For k <= -1, |ln u| > 0.34 and k LN2_HI is exact, so the two
 * additions and ln m's error stay below 2^-49 |ln u|. u = 1 gives 0 exactly; u = 0 a finite
 * value the caller's bound rejects (its 2^-60/u term is infinite). */
static inline __attribute__((always_inline)) double log_unit(double u) {
    uint64_t bits;
    memcpy(&bits, &u, sizeof bits);
    const uint64_t mbits = (bits & 0x000fffffffffffffULL) | 0x3ff0000000000000ULL;
    double m;
    memcpy(&m, &mbits, sizeof m);
    const int64_t k0 = (int64_t)(bits >> 52) - 1023;
    const int big = m >= SQRT2;
    m = big ? m * 0.5 : m;
    const double k = (double)(k0 + big);
    const double f = m - 1.0;
    const double s = f / (2.0 + f), s2 = s * s;
    double p = 0x1.8618618618618p-5; /* 1/21 */
    p = p * s2 + 0x1.af286bca1af28p-5; /* 1/19 */
    p = p * s2 + 0x1.e1e1e1e1e1e1ep-5; /* 1/17 */
    p = p * s2 + 0x1.1111111111111p-4; /* 1/15 */
    p = p * s2 + 0x1.3b13b13b13b14p-4; /* 1/13 */
    p = p * s2 + 0x1.745d1745d1746p-4; /* 1/11 */
    p = p * s2 + 0x1.c71c71c71c71cp-4; /* 1/9 */
    p = p * s2 + 0x1.2492492492492p-3; /* 1/7 */
    p = p * s2 + 0x1.999999999999ap-3; /* 1/5 */
    p = p * s2 + 0x1.5555555555555p-2; /* 1/3 */
    p = p * s2 + 1.0;
    const double ln_m = (2.0 * s) * p;
    return k * LN2_HI + (k * LN2_LO + ln_m);
}

/* cos(2 pi v) for v in [-1/2, 1/2]: market._normal.cos_2pi, operation for operation (its
 * coefficients (-1)^k/(2k+1)! as Python rounds them), so the same doubles as the reference. */
static inline __attribute__((always_inline)) double cos_2pi(double v) {
    double x = fabs(v);
    x -= 0.25;
    x *= -0x1.921fb54442d18p+2; /* -2 pi */
    const double z = x * x;
    double p = z * -0x1.2f49b46814157p-57;
    p += 0x1.952c77030ad4ap-49;
    p *= z;
    p += -0x1.ae7f3e733b81fp-41;
    p *= z;
    p += 0x1.6124613a86d09p-33;
    p *= z;
    p += -0x1.ae64567f544e4p-26;
    p *= z;
    p += 0x1.71de3a556c734p-19;
    p *= z;
    p += -0x1.a01a01a01a01ap-13;
    p *= z;
    p += 0x1.1111111111111p-7;
    p *= z;
    p += -0x1.5555555555555p-3;
    p *= z;
    p += 1.0;
    return p * x;
}

#define U64 0x1p-64

/* The standard normal of words (w1, w2) (read as signed, as market._normal.normals reads them)
 * and its error bound: z = 0 and err = inf where the bound is not finite (the exact path). */
static inline __attribute__((always_inline)) void normal_at(int64_t w1, int64_t w2, double c_log, double c_cos, double *z_out,
                             double *err_out) {
    double u = (double)w1;
    u *= U64;
    u += (double)(u < 0.0);
    double r2 = log_unit(u);
    r2 *= -2.0;
    double d_r2 = 0x1p-60 / u;
    d_r2 += 0x1p-48;
    d_r2 += r2 * c_log;
    const double r = sqrt(r2);
    double e = d_r2 / r;
    e *= 1.0 + 0x1p-50;
    double v = (double)w2;
    v *= U64; /* U2 modulo 1, in [-1/2, 1/2) */
    double z = cos_2pi(v) * r;
    e += r * c_cos;
    e += fabs(z) * (2.0 * U53);
    const int ok = isfinite(e);
    *z_out = ok ? z : 0.0;
    *err_out = ok ? e : INFINITY;
}

/* market._normal.snap of x + z (bound err) on the grid 1/scale: the integer, and whether the
 * float pass leaves it undecided (then 0 is added to floor(x scale), settled by the caller). */
static inline __attribute__((always_inline)) int64_t snap_at(double x, double z, double err, double scale, unsigned char *und) {
    const double q = x * scale, xi = floor(q);
    double t = q - xi;
    t += z * scale;
    double margin = fabs(t);
    margin += 2.0;
    margin *= 2.0 * U53;
    margin += err * scale;
    double dist = t + 0.5;
    double f = floor(dist);
    dist -= f;
    const int u = !(dist > margin) | (dist >= 1.0 - margin);
    *und = (unsigned char)u;
    f = u ? 0.0 : f;
    return (int64_t)xi + (int64_t)f;
}

SIMD_CLONES
static void normals_kernel(const int64_t *w1, const int64_t *w2, Py_ssize_t n, double c_log,
                           double c_cos, double *restrict z, double *restrict err) {
    for (Py_ssize_t i = 0; i < n; i++) normal_at(w1[i], w2[i], c_log, c_cos, z + i, err + i);
}

/* -------------------------------------------------------------------------------- normals */
PyDoc_STRVAR(normals_doc,
             "normals(words, c_log, c_cos, two_pi_u64) -> (bytearray, bytearray)\n\n"
             "market._normal.normals' float pass over two rows of n words (U1, U2): the\n"
             "Box-Muller normals and their error bounds (float64), cos(2 pi U2) as the\n"
             "reference's polynomial, ln U1 within 2^-49 (log_unit); c_log = 2*TAU,\n"
             "c_cos = 2^-48 + 2*TAU + 2^-53 (two_pi_u64 is unused). A coordinate whose bound is\n"
             "not finite gets z = 0 and err = inf (the exact path).");

static PyObject *normals(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words;
    double c_log, c_cos, two_pi_u64;
    if (!PyArg_ParseTuple(args, "y*ddd", &words, &c_log, &c_cos, &two_pi_u64)) return NULL;
    PyObject *zs = NULL, *errs = NULL, *result = NULL;
    if (words.len % 16 != 0) {
        PyErr_SetString(PyExc_ValueError, "normals needs two rows of words");
        goto done;
    }
    Py_ssize_t n = words.len / 16;
    zs = PyByteArray_FromStringAndSize(NULL, 8 * n);
    errs = PyByteArray_FromStringAndSize(NULL, 8 * n);
    if (zs == NULL || errs == NULL) goto done;
    const int64_t *w1 = (const int64_t *)words.buf;
    normals_kernel(w1, w1 + n, n, c_log, c_cos, (double *)PyByteArray_AS_STRING(zs),
                   (double *)PyByteArray_AS_STRING(errs));
    result = PyTuple_Pack(2, zs, errs);
done:
    Py_XDECREF(zs);
    Py_XDECREF(errs);
    PyBuffer_Release(&words);
    return result;
}

/* ------------------------------------------------------------------------ table_segments */
PyDoc_STRVAR(table_segments_doc,
             "table_segments(words, sizes, tables) -> (bytearray, list)\n\n"
             "market._poisson.sample's float pass: segment i (sizes[i] words of one row) is\n"
             "drawn by inversion of tables[i] = (cdf, lo, margin), the cdf a contiguous float64\n"
             "buffer. Returns the int64 outcomes (lo + the thresholds at or below U's prefix) and the indices left\n"
             "undecided.");

static PyObject *table_segments(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words;
    PyObject *sizes_obj, *tables;
    if (!PyArg_ParseTuple(args, "y*OO", &words, &sizes_obj, &tables)) return NULL;
    Py_ssize_t m = 0, n = 0;
    PyObject *out = NULL, *undecided = NULL, *result = NULL, *fast = NULL;
    Py_ssize_t *sizes = read_sizes(sizes_obj, &m, &n);
    if (sizes == NULL) goto done;
    fast = PySequence_Fast(tables, "tables must be a sequence");
    if (fast == NULL) goto done;
    if (words.len != 8 * n || PySequence_Fast_GET_SIZE(fast) != m) {
        PyErr_SetString(PyExc_ValueError, "table_segments: one table per size, n words");
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    undecided = PyList_New(0);
    if (out == NULL || undecided == NULL) goto done;
    const uint64_t *w = (const uint64_t *)words.buf;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    Py_ssize_t i = 0;
    for (Py_ssize_t seg = 0; seg < m; seg++) {
        Py_buffer table;
        long long lo;
        double margin;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, seg), "y*Ld", &table, &lo, &margin))
            goto done;
        const double *cdf = (const double *)table.buf;
        const Py_ssize_t len = table.len / 8;
        for (Py_ssize_t end = i + sizes[seg]; i < end; i++) {
            const double u = (double)(w[i] >> 11) * U53;
            Py_ssize_t a = 0, b = len; /* searchsorted(cdf, u, side="right") */
            while (a < b) {
                Py_ssize_t mid = a + (b - a) / 2;
                if (cdf[mid] <= u) a = mid + 1;
                else b = mid;
            }
            const double below = a > 0 ? cdf[a - 1] : 0.0, above = a < len ? cdf[a] : 2.0;
            const int ok = u >= below + margin && u + U53 + margin <= above && a < len;
            o[i] = (int64_t)lo + (int64_t)a;
            if (!ok) {
                if (append_index(undecided, i) < 0) {
                    PyBuffer_Release(&table);
                    goto done;
                }
            }
        }
        PyBuffer_Release(&table);
    }
    result = PyTuple_Pack(2, out, undecided);
done:
    Py_XDECREF(fast);
    Py_XDECREF(out);
    Py_XDECREF(undecided);
    PyMem_Free(sizes);
    PyBuffer_Release(&words);
    return result;
}

/* -------------------------------------------------------------------------- gaussian_snap */
PyDoc_STRVAR(gaussian_snap_doc,
             "gaussian_snap(words, terms, x, scale, consts) -> (bytearray, list) or None\n\n"
             "A Gaussian chain step's float pass: the normals of each term (words: 2 rows of\n"
             "len(terms) * n words, term j's coordinates at j*n...), summed as market._normal.add\n"
             "sums them (terms: (c, |c|(1 + 2^-49)) per term, top first), then rounded as\n"
             "market._normal.snap rounds x + Z on the grid of 1/scale. Returns the int64\n"
             "integers and the indices left undecided, or None when a value is too large for\n"
             "its grid. consts are normals' (c_log, c_cos, two_pi_u64).");

/* Whether every |x scale| is below 2^62 (NaN is not): snap's range. */
static int in_range(const double *x, Py_ssize_t n, double scale) {
    int ok = 1;
    for (Py_ssize_t i = 0; i < n; i++) ok &= fabs(x[i] * scale) < 0x1p62;
    return ok;
}

/* The flagged coordinates' indices appended to a new list (NULL with an error set). */
static PyObject *flagged(const unsigned char *und, Py_ssize_t n) {
    PyObject *list = PyList_New(0);
    if (list == NULL) return NULL;
    for (const unsigned char *p = und, *end = und + n; (p = memchr(p, 1, (size_t)(end - p)));
         p++) {
        if (append_index(list, p - und) < 0) {
            Py_DECREF(list);
            return NULL;
        }
    }
    return list;
}

static PyObject *gaussian_snap(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words, terms, xs;
    double scale, c_log, c_cos, two_pi_u64;
    if (!PyArg_ParseTuple(args, "y*y*y*d(ddd)", &words, &terms, &xs, &scale, &c_log, &c_cos,
                          &two_pi_u64))
        return NULL;
    PyObject *out = NULL, *result = NULL;
    unsigned char *und = NULL;
    const Py_ssize_t n = xs.len / 8, depth = terms.len / 16;
    if (words.len != 16 * n * depth) {
        PyErr_SetString(PyExc_ValueError, "gaussian_snap: words of the wrong size");
        goto done;
    }
    const double *x = (const double *)xs.buf, *tc = (const double *)terms.buf;
    if (!in_range(x, n, scale)) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    und = PyMem_Malloc(n ? (size_t)n : 1);
    if (out == NULL || und == NULL) {
        if (und == NULL) PyErr_NoMemory();
        goto done;
    }
    const int64_t *w1 = (const int64_t *)words.buf, *w2 = w1 + n * depth;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        double hz = 0.0, herr = 0.0;
        for (Py_ssize_t j = 0; j < depth; j++) {
            double nz, e;
            normal_at(w1[j * n + i], w2[j * n + i], c_log, c_cos, &nz, &e);
            /* add(h, c, N) */
            double z = nz * tc[2 * j];
            double err = e * tc[2 * j + 1];
            err += fabs(z) * 0x1p-49;
            err += herr;
            z += hz;
            err += fabs(z) * U53;
            hz = z;
            herr = err;
        }
        o[i] = snap_at(x[i], hz, herr, scale, und + i);
    }
    PyObject *undecided = flagged(und, n);
    if (undecided != NULL) {
        result = PyTuple_Pack(2, out, undecided);
        Py_DECREF(undecided);
    }
done:
    Py_XDECREF(out);
    PyMem_Free(und);
    PyBuffer_Release(&words);
    PyBuffer_Release(&terms);
    PyBuffer_Release(&xs);
    return result;
}

/* ------------------------------------------------------------------------- gaussian_pass */
/* What the new normal is added to: nothing (a fresh release), an anchor's float pass h, or a
 * bridge's mixture fa a + fb b (a absent for the exact value's noise, 0). */
typedef struct {
    const double *az, *aerr, *bz, *berr;
    double fa, fa_err, fb, fb_err; /* weights and |w| (1 + 2^-50) */
} prior;

enum { FRESH, ADD, MIX_B, MIX_AB };

/* One coordinate of market._normal.add_normals (its Mixed.block and _add_into, operation for
 * operation) then snap: z and err written, the integer returned. */
static inline __attribute__((always_inline)) int64_t pass_at(int mode, const prior *h, Py_ssize_t i, int64_t w1, int64_t w2,
                              double c, double c_err, double c_log, double c_cos, double x,
                              double scale, double *z_out, double *err_out, unsigned char *und) {
    double nz, ne;
    normal_at(w1, w2, c_log, c_cos, &nz, &ne);
    double z = nz * c, err = ne * c_err;
    err += fabs(z) * 0x1p-49;
    if (mode != FRESH) {
        double hz, herr;
        if (mode == ADD) {
            hz = h->az[i];
            herr = h->aerr[i];
        } else {
            const double pb = h->bz[i] * h->fb, eb = h->berr[i] * h->fb_err;
            double pa;
            if (mode == MIX_B) {
                herr = eb;
                hz = pb;
                pa = fabs(pb);
            } else {
                const double qa = h->az[i] * h->fa;
                herr = h->aerr[i] * h->fa_err;
                herr += eb;
                hz = qa + pb;
                pa = fabs(qa) + fabs(pb);
            }
            pa *= 0x1p-50;
            herr += pa;
            herr += fabs(hz) * U53;
        }
        err += herr;
        z += hz;
        err += fabs(z) * U53;
    }
    *z_out = z;
    *err_out = err;
    return snap_at(x, z, err, scale, und);
}

SIMD_CLONES
static void pass_kernel(int mode, const prior *h, const int64_t *w1, const int64_t *w2,
                        Py_ssize_t n, double c, double c_err, double c_log, double c_cos,
                        const double *x, double scale, double *restrict z,
                        double *restrict err, int64_t *restrict o, unsigned char *restrict und) {
    const prior hv = *h; /* a local copy: its pointers cannot change inside the loops */
    /* one loop per mode, so each is a straight vectorisable line */
#define PASS_LOOP(M)                                                                          \
    for (Py_ssize_t i = 0; i < n; i++)                                                        \
        o[i] = pass_at(M, &hv, i, w1[i], w2[i], c, c_err, c_log, c_cos, x[i], scale, z + i,    \
                       err + i, und + i);
    switch (mode) {
    case FRESH: PASS_LOOP(FRESH) break;
    case ADD: PASS_LOOP(ADD) break;
    case MIX_B: PASS_LOOP(MIX_B) break;
    default: PASS_LOOP(MIX_AB) break;
    }
#undef PASS_LOOP
}

/* A float64 buffer of n doubles (read-only, or writable), or an error. */
static int get_doubles(PyObject *obj, Py_buffer *view, Py_ssize_t n, int writable) {
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS
                                               : PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view->len != 8 * n) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "gaussian_pass: arrays of n doubles");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(gaussian_pass_doc,
             "gaussian_pass(words, coef, x, scale, consts, prior, z, err, out) -> list or None\n\n"
             "A Gaussian release's float pass over n coordinates in one loop: the normals of\n"
             "words (2 rows of n), times coef = (c, |c|(1 + 2^-49)), added to prior as\n"
             "market._normal.add_normals adds them, then rounded as market._normal.snap rounds\n"
             "x + Z on the grid of 1/scale. prior is None (fresh), (hz, herr) (an anchor's\n"
             "float pass) or (az, aerr, fa, fa_err, bz, berr, fb, fb_err) (a bridge's mixture;\n"
             "az and aerr None for the exact value), weights with |w|(1 + 2^-50). Writes the sum\n"
             "and its bound into z and err and the int64 integers into out (writable buffers of\n"
             "n); returns the indices left undecided, or None when a value is too large for\n"
             "its grid (nothing written). consts are normals' (c_log, c_cos, two_pi_u64).");

static PyObject *gaussian_pass(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words, xs;
    double c, c_err, scale, c_log, c_cos, two_pi_u64;
    PyObject *prior_obj, *z_obj, *err_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "y*(dd)y*d(ddd)OOOO", &words, &c, &c_err, &xs, &scale, &c_log,
                          &c_cos, &two_pi_u64, &prior_obj, &z_obj, &err_obj, &out_obj))
        return NULL;
    const Py_ssize_t n = xs.len / 8;
    Py_buffer views[7]; /* z, err, out, then the prior's arrays */
    int held = 0, mode = FRESH;
    PyObject *result = NULL, *arrays[4] = {NULL, NULL, NULL, NULL};
    prior h = {NULL, NULL, NULL, NULL, 0.0, 0.0, 0.0, 0.0};
    unsigned char *und = NULL;
    if (words.len != 16 * n) {
        PyErr_SetString(PyExc_ValueError, "gaussian_pass: two rows of n words");
        goto done;
    }
    if (prior_obj != Py_None) {
        PyObject *az = NULL, *aerr = NULL, *bz = NULL, *berr = NULL;
        if (PyTuple_Check(prior_obj) && PyTuple_GET_SIZE(prior_obj) == 2) {
            if (!PyArg_ParseTuple(prior_obj, "OO", &az, &aerr)) goto done;
            mode = ADD;
        } else if (!PyArg_ParseTuple(prior_obj, "OOddOOdd", &az, &aerr, &h.fa, &h.fa_err, &bz,
                                     &berr, &h.fb, &h.fb_err)) {
            goto done;
        } else {
            mode = az == Py_None ? MIX_B : MIX_AB;
        }
        arrays[0] = az == Py_None ? NULL : az;
        arrays[1] = az == Py_None ? NULL : aerr;
        arrays[2] = bz;
        arrays[3] = berr;
    }
    PyObject *outs[3] = {z_obj, err_obj, out_obj};
    for (int k = 0; k < 3; k++, held++)
        if (get_doubles(outs[k], &views[held], n, 1) < 0) goto done;
    for (int k = 0; k < 4; k++) {
        if (arrays[k] == NULL) continue;
        if (get_doubles(arrays[k], &views[held], n, 0) < 0) goto done;
        const double *p = (const double *)views[held++].buf;
        if (k == 0) h.az = p;
        else if (k == 1) h.aerr = p;
        else if (k == 2) h.bz = p;
        else h.berr = p;
    }
    if (!in_range((const double *)xs.buf, n, scale)) {
        result = Py_None;
        Py_INCREF(result);
        goto done;
    }
    und = PyMem_Malloc(n ? (size_t)n : 1);
    if (und == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *w1 = (const int64_t *)words.buf;
    pass_kernel(mode, &h, w1, w1 + n, n, c, c_err, c_log, c_cos, (const double *)xs.buf, scale,
                (double *)views[0].buf, (double *)views[1].buf, (int64_t *)views[2].buf, und);
    result = flagged(und, n);
done:
    while (held > 0) PyBuffer_Release(&views[--held]);
    PyMem_Free(und);
    PyBuffer_Release(&words);
    PyBuffer_Release(&xs);
    return result;
}

/* ----------------------------------------------------------------------------- dlap_plans */
/* ``floor(E / s)`` of market._dlap._floor_exponential (not inverse), E = -log(1 - u y). */
static double floor_exponential(double u, double y, double inv_s, double eta, int *und) {
    const double arg = u * y;
    double e = log1p(-arg);
    e *= -1.0;
    const double de = (2.0 * U53 * y) / (1.0 - arg);
    double x_lo = e * inv_s;
    x_lo *= 1.0 - eta;
    double x_hi = e + de;
    x_hi *= inv_s;
    x_hi *= 1.0 + eta;
    if (x_lo > G_MAX) x_lo = G_MAX;
    const double g = floor(x_lo);
    *und = floor(x_hi) != g || x_hi >= G_MAX || arg > 1.0 - 2.0 * U53;
    return g;
}

PyDoc_STRVAR(dlap_plans_doc,
             "dlap_plans(words, sizes, laws, margin, eta) -> (bytearray, list)\n\n"
             "market._dlap.sample_into's float pass for fresh and tightening laws whose\n"
             "geometric takes several uniforms (a Plan with chunks), segment i (sizes[i]\n"
             "coordinates of the joined words, slots rows) on laws[i]: float64 bytes of\n"
             "(e0, e1, 1/top, 2^(61 - shift), shift, chunks, then per chunk m, b, 1/sigma,\n"
             "1 - e^(-sigma 2^b), 2^b). Returns the int64 noise and the indices left undecided.");

static PyObject *dlap_plans(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words;
    PyObject *sizes_obj, *laws;
    double margin, eta;
    if (!PyArg_ParseTuple(args, "y*OOdd", &words, &sizes_obj, &laws, &margin, &eta)) return NULL;
    Py_ssize_t m = 0, n = 0;
    PyObject *out = NULL, *undecided = NULL, *result = NULL, *fast = NULL;
    Py_ssize_t *sizes = read_sizes(sizes_obj, &m, &n);
    if (sizes == NULL) goto done;
    fast = PySequence_Fast(laws, "laws must be a sequence of bytes");
    if (fast == NULL) goto done;
    if (n == 0 || words.len % (8 * n) != 0 || PySequence_Fast_GET_SIZE(fast) != m) {
        PyErr_SetString(PyExc_ValueError, "dlap_plans: one law per size, slots rows of words");
        goto done;
    }
    const Py_ssize_t slots = words.len / (8 * n);
    out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    undecided = PyList_New(0);
    if (out == NULL || undecided == NULL) goto done;
    const uint64_t *w = (const uint64_t *)words.buf;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    Py_ssize_t i = 0;
    for (Py_ssize_t seg = 0; seg < m; seg++) {
        PyObject *law = PySequence_Fast_GET_ITEM(fast, seg);
        if (!PyBytes_Check(law) || PyBytes_GET_SIZE(law) < 48) {
            PyErr_SetString(PyExc_TypeError, "a law is float64 bytes");
            goto done;
        }
        const double *p = (const double *)PyBytes_AS_STRING(law);
        const double e0 = p[0], e1 = p[1], inv_top = p[2], g_max = p[3];
        const int shift = (int)p[4];
        const Py_ssize_t chunks = (Py_ssize_t)p[5];
        if (PyBytes_GET_SIZE(law) != 8 * (6 + 5 * chunks) || slots != 2 + chunks) {
            PyErr_SetString(PyExc_ValueError, "dlap_plans: a law's plan does not match the slots");
            goto done;
        }
        const double slack = margin + U53, lo0 = e0 + margin, lo1 = e1 + margin,
                     hi0 = e0 - slack, hi1 = e1 - slack;
        for (Py_ssize_t end = i + sizes[seg]; i < end; i++) {
            const double u1 = (double)(w[i] >> 11) * U53;
            const int lo = (u1 >= lo0) + (u1 >= lo1), hi = (u1 > hi0) + (u1 > hi1);
            int und = lo != hi, und_g = 0, und_k;
            /* _geometric: H from slot 1, then each chunk's digits from slots 2... */
            double h = floor_exponential((double)(w[n + i] >> 11) * U53, 1.0, inv_top, eta, &und_g);
            und_g |= h >= g_max;
            if (und_g) h = 0.0;
            int64_t g = (int64_t)h << shift;
            for (Py_ssize_t k = 0; k < chunks; k++) {
                const double *c = p + 6 + 5 * k;
                const double u = (double)(w[(2 + k) * n + i] >> 11) * U53;
                const double r = floor_exponential(u, c[3], c[2], eta, &und_k);
                und_g |= und_k || r >= c[4];
                g += (int64_t)(r < c[4] - 1.0 ? r : c[4] - 1.0) << (int)c[0];
            }
            und |= und_g && lo != 1; /* the part's atom needs no geometric */
            const int64_t g1 = g + 1;
            o[i] = lo == 2 ? g1 : (lo == 0 ? -g1 : 0);
            if (und) {
                if (append_index(undecided, i) < 0) {
                    goto done;
                }
            }
        }
    }
    result = PyTuple_Pack(2, out, undecided);
done:
    Py_XDECREF(fast);
    Py_XDECREF(out);
    Py_XDECREF(undecided);
    PyMem_Free(sizes);
    PyBuffer_Release(&words);
    return result;
}

static PyMethodDef methods[] = {
    {"request_keys", request_keys, METH_VARARGS, request_keys_doc},
    {"main_words", main_words, METH_VARARGS, main_words_doc},
    {"keyed_words", keyed_words, METH_VARARGS, keyed_words_doc},
    {"dlap_segments", dlap_segments, METH_VARARGS, dlap_segments_doc},
    {"dlap_plans", dlap_plans, METH_VARARGS, dlap_plans_doc},
    {"normals", normals, METH_VARARGS, normals_doc},
    {"table_segments", table_segments, METH_VARARGS, table_segments_doc},
    {"gaussian_snap", gaussian_snap, METH_VARARGS, gaussian_snap_doc},
    {"gaussian_pass", gaussian_pass, METH_VARARGS, gaussian_pass_doc},
    {"wide", wide, METH_NOARGS, wide_doc},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cnoise",
                                    "The compiled noise step (see market/_step.py).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cnoise(void) { return PyModule_Create(&module); }
