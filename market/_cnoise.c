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

/* -------------------------------------------------------------------------------- normals */
PyDoc_STRVAR(normals_doc,
             "normals(words, c_log, c_cos, two_pi_u64) -> (bytearray, bytearray)\n\n"
             "market._normal.normals' float pass over two rows of n words (U1, U2): the\n"
             "Box-Muller normals and their error bounds (float64), each expression as numpy\n"
             "evaluates it; c_log = 2*TAU, c_cos = 2^-48 + 2*TAU + 2^-53, two_pi_u64 = 2*pi*2^-64.\n"
             "A coordinate whose bound is not finite gets z = 0 and err = inf (the exact path).");

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
    const int64_t *w1 = (const int64_t *)words.buf, *w2 = w1 + n;
    double *z = (double *)PyByteArray_AS_STRING(zs), *err = (double *)PyByteArray_AS_STRING(errs);
    const double u64 = 1.0 / 18446744073709551616.0; /* 2^-64 */
    for (Py_ssize_t i = 0; i < n; i++) {
        double u = (double)w1[i];
        u *= u64;
        u += (double)(u < 0.0);
        double r2 = log(u);
        r2 *= -2.0;
        double d_r2 = 8.673617379884035e-19 / u; /* 2^-60 */
        d_r2 += 3.552713678800501e-15;           /* 2^-48 */
        d_r2 += r2 * c_log;
        const double r = sqrt(r2);
        double e = d_r2 / r;
        e *= 1.0 + 8.881784197001252e-16; /* 1 + 2^-50 */
        double theta = (double)w2[i];
        theta *= two_pi_u64;
        double zi = cos(theta);
        zi *= r;
        e += r * c_cos;
        e += fabs(zi) * (2.0 * U53);
        if (!isfinite(e)) {
            zi = 0.0;
            e = INFINITY;
        }
        z[i] = zi;
        err[i] = e;
    }
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

static PyObject *gaussian_snap(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer words, terms, xs;
    double scale, c_log, c_cos, two_pi_u64;
    if (!PyArg_ParseTuple(args, "y*y*y*d(ddd)", &words, &terms, &xs, &scale, &c_log, &c_cos,
                          &two_pi_u64))
        return NULL;
    PyObject *out = NULL, *undecided = NULL, *result = NULL;
    const Py_ssize_t n = xs.len / 8, depth = terms.len / 16;
    if (words.len != 16 * n * depth) {
        PyErr_SetString(PyExc_ValueError, "gaussian_snap: words of the wrong size");
        goto done;
    }
    const double *x = (const double *)xs.buf, *tc = (const double *)terms.buf;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!(fabs(x[i] * scale) < 4611686018427387904.0)) { /* 2^62 */
            result = Py_None;
            Py_INCREF(result);
            goto done;
        }
    }
    out = PyByteArray_FromStringAndSize(NULL, 8 * n);
    undecided = PyList_New(0);
    if (out == NULL || undecided == NULL) goto done;
    const int64_t *w1 = (const int64_t *)words.buf, *w2 = w1 + n * depth;
    int64_t *o = (int64_t *)PyByteArray_AS_STRING(out);
    const double u64 = 1.0 / 18446744073709551616.0, e49 = 1.7763568394002505e-15; /* 2^-49 */
    for (Py_ssize_t i = 0; i < n; i++) {
        double hz = 0.0, herr = 0.0;
        for (Py_ssize_t j = 0; j < depth; j++) {
            /* normals (as in the normals function above) */
            const Py_ssize_t at = j * n + i;
            double u = (double)w1[at];
            u *= u64;
            u += (double)(u < 0.0);
            double r2 = log(u);
            r2 *= -2.0;
            double d_r2 = 8.673617379884035e-19 / u;
            d_r2 += 3.552713678800501e-15;
            d_r2 += r2 * c_log;
            const double r = sqrt(r2);
            double e = d_r2 / r;
            e *= 1.0 + 8.881784197001252e-16;
            double theta = (double)w2[at];
            theta *= two_pi_u64;
            double nz = cos(theta);
            nz *= r;
            e += r * c_cos;
            e += fabs(nz) * (2.0 * U53);
            if (!isfinite(e)) {
                nz = 0.0;
                e = INFINITY;
            }
            /* add(h, c, N) */
            double z = nz * tc[2 * j];
            double err = e * tc[2 * j + 1];
            err += fabs(z) * e49;
            err += herr;
            z += hz;
            err += fabs(z) * U53;
            hz = z;
            herr = err;
        }
        /* snap */
        const double q = x[i] * scale, xi = floor(q);
        double t = q - xi;
        t += hz * scale;
        double margin = fabs(t);
        margin += 2.0;
        margin *= 2.0 * U53;
        margin += herr * scale;
        double f = floor(t + 0.5);
        double dist = t + 0.5;
        dist -= f;
        const int und = dist <= margin || dist >= 1.0 - margin || !isfinite(margin);
        if (und) {
            f = 0.0;
            if (append_index(undecided, i) < 0) {
                goto done;
            }
        }
        o[i] = (int64_t)xi + (int64_t)f;
    }
    result = PyTuple_Pack(2, out, undecided);
done:
    Py_XDECREF(out);
    Py_XDECREF(undecided);
    PyBuffer_Release(&words);
    PyBuffer_Release(&terms);
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
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cnoise",
                                    "The compiled noise step (see market/_step.py).", -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__cnoise(void) { return PyModule_Create(&module); }
