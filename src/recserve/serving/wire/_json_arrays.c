/* A JSON array of numbers read into 8-byte slots: int64 while every number is an integer, double (every slot)
 * once one is not, as numpy makes an array of the list json.loads returns.  Anything this cannot read exactly
 * so (true, null, strings, NaN, an integer past 19 digits or int64, more than 19 significant digits, a result
 * that is infinite, a syntax error) is refused: the caller then asks another reader.
 *
 * Decimal to double: the Eisel-Lemire algorithm (Lemire, "Number Parsing at a Gigabyte per Second", 2021) with
 * a 128-bit table of powers of five (scripts/gen_pow5_table.py); for at most 19 significant digits it is correctly
 * rounded with no fallback, subnormals included (Mushtak and Lemire, "Fast Number Parsing Without Fallback").
 *
 * Python: parse(src, out) -> (count, is_float, nested) or None.  src: a bytes-like object holding the array; out: a
 * writable buffer of at least 8 bytes per number (room(src) numbers hold every one).  The interpreter lock is
 * released while it runs. */

#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE /* memmem */
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif
#ifdef __SSE4_1__
#include <smmintrin.h>
#endif

#include "_json_arrays_pow5.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SWAR digit tricks read bytes little-endian: not built here (simdjson reads JSON tensors instead)"
#endif

typedef unsigned char uchar;

enum { REFUSED = 0, INTEGER = 1, FLOAT = 2 };

static inline int is_digit(uchar c) { return (unsigned)(c - '0') < 10u; }
static inline int is_space(uchar c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static inline const uchar *skip_space(const uchar *p, const uchar *end) {
    while (p < end && is_space(*p)) p++;
    return p;
}

/* w * 10^q as a double's bits (sign apart); *ok = 0 when refused (infinite). */
static uint64_t decimal_bits(uint64_t w, int64_t q, int *ok) {
    *ok = 1;
    if (w == 0 || q < POW5_SMALLEST) return 0;  /* zero */
    if (q > POW5_LARGEST) { *ok = 0; return 0; }  /* infinite */
    int lz = __builtin_clzll(w);
    w <<= lz;
    size_t index = 2 * (size_t)(q - POW5_SMALLEST);
    unsigned __int128 first = (unsigned __int128)w * POW5_128[index];
    uint64_t high = (uint64_t)(first >> 64), low = (uint64_t)first;
    const uint64_t precision_mask = UINT64_C(0xFFFFFFFFFFFFFFFF) >> 55;  /* 52 explicit bits + 3 */
    if ((high & precision_mask) == precision_mask) {
        uint64_t second_high = (uint64_t)(((unsigned __int128)w * POW5_128[index + 1]) >> 64);
        low += second_high;
        if (second_high > low) high++;
    }
    int upperbit = (int)(high >> 63);
    int shift = upperbit + 64 - 52 - 3;
    uint64_t mantissa = high >> shift;
    int64_t power2 = ((((152170 + 65536) * q) >> 16) + 63) + upperbit - lz + 1023;
    if (power2 <= 0) {  /* subnormal, or zero */
        if (-power2 + 1 >= 64) return 0;
        mantissa >>= -power2 + 1;
        mantissa += mantissa & 1;
        mantissa >>= 1;
        /* rounding up may reach the smallest normal: its bit 52 is then the exponent's 1 */
        return mantissa < (UINT64_C(1) << 52) ? mantissa : mantissa | (UINT64_C(1) << 52);
    }
    if (low <= 1 && q >= -4 && q <= 23 && (mantissa & 3) == 1 && (mantissa << shift) == high)
        mantissa &= ~UINT64_C(1);  /* exactly halfway: round to even */
    mantissa += mantissa & 1;
    mantissa >>= 1;
    if (mantissa >= (UINT64_C(2) << 52)) {
        mantissa = UINT64_C(1) << 52;
        power2++;
    }
    mantissa &= ~(UINT64_C(1) << 52);
    if (power2 >= 0x7FF) { *ok = 0; return 0; }  /* infinite: refused */
    return mantissa | ((uint64_t)power2 << 52);
}

static const uint64_t POW10[17] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000,
                                   10000000000, 100000000000, 1000000000000, 10000000000000, 100000000000000,
                                   1000000000000000, 10000000000000000};

/* Up to eight digits in v's low len bytes, as a number: the digits moved up behind leading zeros, then pairs,
 * fours and eights summed by multiplies (SWAR). */
static inline uint64_t swar_value(uint64_t v, int len) {
    uint64_t d = (v - UINT64_C(0x3030303030303030)) << (8 * (8 - len));
    d = d * 10 + (d >> 8);
    return (((d & UINT64_C(0x000000FF000000FF)) * (100 + (UINT64_C(1000000) << 32)))
            + (((d >> 16) & UINT64_C(0x000000FF000000FF)) * (1 + (UINT64_C(10000) << 32)))) >> 32;
}

/* Flags (the high bit of a byte) on v's bytes that are no digit: the first one exactly (later ones may be false). */
static inline uint64_t non_digits(uint64_t v) {
    const uint64_t ones = UINT64_C(0x0101010101010101), high = 0x80 * ones;
    return (((v - 0x30 * ones) & ~v) | (v + 0x46 * ones) | v) & high;
}

/* A mask of v's low k bytes (1-8). */
static inline uint64_t low_bytes(int k) { return k == 8 ? ~UINT64_C(0) : (UINT64_C(1) << (8 * k)) - 1; }

/* Whether v's low len bytes (1-8) are an integer JSON allows (no leading zero): most ids, read by one swar_value. */
static inline int short_integer(uint64_t v, int len) {
    return (non_digits(v) & low_bytes(len)) == 0 && ((v & 0xFF) != '0' || len == 1);
}

/* How many of v's bytes lead as digits (0-8). */
static inline int leading_digits(uint64_t v) {
    uint64_t flags = non_digits(v);
    return flags ? __builtin_ctzll(flags) >> 3 : 8;
}

/* The run of digits at p added to *w (*count digits so far, at most 19 in all), eight bytes at a time where eight
 * are there (SWAR: the first byte that is no digit found with bit tricks, then the digits' value by multiplies).
 * Returns where the digits end, or NULL past 19 digits. */
static inline const uchar *digits(const uchar *p, const uchar *end, uint64_t *w, int *count) {
    while (end - p >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        int k = leading_digits(v);
        if (k == 0) return p;
        if (*count + k > 19) return NULL;
        *w = *w * POW10[k] + swar_value(v, k);
        *count += k;
        p += k;
        if (k < 8) return p;
    }
    while (p < end && is_digit(*p)) {
        if (*count == 19) return NULL;
        *w = *w * 10 + (uint64_t)(*p - '0');
        ++*count;
        p++;
    }
    return p;
}

/* One JSON number at p: INTEGER (*as_int), FLOAT (*as_double) or REFUSED; *next is where it ends. */
static int number(const uchar *p, const uchar *end, const uchar **next, int64_t *as_int, double *as_double) {
    int negative = 0;
    if (p < end && *p == '-') { negative = 1; p++; }
    if (p >= end) return REFUSED;
    uint64_t w = 0;
    int count = 0;
    int64_t q = 0;
    if (*p == '0') {
        p++;
        if (p < end && is_digit(*p)) return REFUSED;  /* a leading zero */
    } else if (is_digit(*p)) {
        p = digits(p, end, &w, &count);
        if (p == NULL) return REFUSED;
    } else {
        return REFUSED;
    }
    int is_float = 0;
    if (p < end && *p == '.') {
        is_float = 1;
        const uchar *fraction = ++p;
        if (w == 0)  /* the leading zeros of 0.000x are not significant */
            while (p < end && *p == '0') p++;
        p = digits(p, end, &w, &count);
        if (p == NULL) return REFUSED;
        q -= p - fraction;
        if (p == fraction) return REFUSED;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        is_float = 1;
        p++;
        int exp_negative = 0;
        if (p < end && (*p == '+' || *p == '-')) exp_negative = *p++ == '-';
        const uchar *exp_digits = p;
        int64_t e = 0;
        while (p < end && is_digit(*p)) {
            if (e < 100000) e = e * 10 + (*p - '0');
            p++;
        }
        if (p == exp_digits) return REFUSED;
        q += exp_negative ? -e : e;
    }
    *next = p;
    if (!is_float) {
        if (w > (uint64_t)INT64_MAX + (uint64_t)negative) return REFUSED;  /* past int64 */
        *as_int = negative ? (int64_t)(UINT64_C(0) - w) : (int64_t)w;
        return INTEGER;
    }
    int ok;
    uint64_t bits = decimal_bits(w, q, &ok);
    if (!ok) return REFUSED;
    bits |= (uint64_t)negative << 63;
    memcpy(as_double, &bits, sizeof bits);
    return FLOAT;
}

/* Where the numbers go: int64 slots until the first float, then doubles (those read so far converted in place). */
typedef struct {
    uint64_t *out;
    Py_ssize_t n, cap;
    int floats;
} Sink;

static inline void put_double(uint64_t *slot, double value) { memcpy(slot, &value, sizeof value); }

/* One bit per byte of q[0..64) that is a comma: SSE2 compares where the CPU has them (every x86-64), else eight
 * SWAR words with each comma's byte flagged exactly (no borrow between bytes) and the flags gathered by a multiply. */
static inline uint64_t comma_bits(const uchar *q) {
#ifdef __SSE2__
    const __m128i comma = _mm_set1_epi8(',');
    uint64_t bits = 0;
    for (int i = 0; i < 4; i++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(q + 16 * i));
        bits |= (uint64_t)(uint16_t)_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) << (16 * i);
    }
    return bits;
#else
    const uint64_t ones = UINT64_C(0x0101010101010101), low7 = 0x7F * ones;
    uint64_t bits = 0;
    for (int w = 0; w < 8; w++) {
        uint64_t v;
        memcpy(&v, q + 8 * w, 8);
        uint64_t x = v ^ (0x2C * ones);
        uint64_t flags = ~(((x & low7) + low7) | x | low7);  /* the high bit of each comma byte */
        bits |= ((flags >> 7) * UINT64_C(0x0102040810204080) >> 56) << (8 * w);
    }
    return bits;
#endif
}

static inline int put(Sink *sink, int kind, int64_t as_int, double as_double) {
    if (kind == REFUSED || sink->n == sink->cap) return 0;
    if (kind == FLOAT && !sink->floats) {
        for (Py_ssize_t i = 0; i < sink->n; i++) {
            int64_t v;
            memcpy(&v, &sink->out[i], sizeof v);
            put_double(&sink->out[i], (double)v);
        }
        sink->floats = 1;
    }
    uint64_t *slot = &sink->out[sink->n++];
    if (kind == FLOAT) put_double(slot, as_double);
    else if (sink->floats) put_double(slot, (double)as_int);
    else memcpy(slot, &as_int, sizeof as_int);
    return 1;
}

/* The n (1-16) bytes before e as a number, in *value: 0 unless every one is a digit.  SSE4.1 where the build has
 * it (16 digits in four vector steps), else two SWAR words. */
static inline int last_digits(const uchar *e, int n, uint64_t *value) {
#ifdef __SSE4_1__
    __m128i x = _mm_loadu_si128((const __m128i *)(e - 16));
    __m128i keep = _mm_cmpgt_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                  _mm_set1_epi8((char)(15 - n)));
    __m128i t = _mm_and_si128(_mm_sub_epi8(x, _mm_set1_epi8('0')), keep);  /* the bytes before the n: zeros */
    if (_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(t, _mm_set1_epi8(9)), _mm_set1_epi8(9))) != 0xFFFF) return 0;
    t = _mm_maddubs_epi16(t, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
    t = _mm_madd_epi16(t, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
    t = _mm_packus_epi32(t, t);
    t = _mm_madd_epi16(t, _mm_setr_epi16(10000, 1, 10000, 1, 10000, 1, 10000, 1));
    *value = (uint64_t)(uint32_t)_mm_cvtsi128_si32(t) * 100000000 + (uint32_t)_mm_extract_epi32(t, 1);
    return 1;
#else
    int first = n > 8 ? n - 8 : 0, second = n - first;  /* the digits in the first word, then in the second */
    uint64_t v, high = 0;
    memcpy(&v, e - 8, 8);
    v >>= 8 * (8 - second);  /* the digits at the bottom, so the first byte that is no digit is flagged exactly */
    if (non_digits(v) & low_bytes(second)) return 0;
    if (first) {
        uint64_t u;
        memcpy(&u, e - 16, 8);
        u >>= 8 * (8 - first);
        if (non_digits(u) & low_bytes(first)) return 0;
        high = swar_value(u, first);
    }
    *value = high * POW10[second] + swar_value(v, second);
    return 1;
#endif
}

/* A decimal "-?d{1,8}.d{1,24}" filling [s, e) exactly (no exponent, at most 19 digits in all: what a repr of a
 * float32 or float64 mostly is) as a double's bits in *bits: the fraction's last 16 digits read at once (last_digits)
 * and any before them by SWAR, with no branch on how many digits there are.  0 where the element is otherwise
 * (number() reads it then); begin: the span's start (loads end at e). */
static inline int plain_decimal(const uchar *begin, const uchar *s, const uchar *e, const uchar *limit,
                                uint64_t *bits) {
    uint64_t negative = *s == '-';
    s += negative;
    if (limit - s < 8) return 0;
    uint64_t v;
    memcpy(&v, s, 8);
    int whole = leading_digits(v);
    if (whole == 0 || whole == 8 || s[whole] != '.' || (s[0] == '0' && whole > 1)) return 0;
    const uchar *f = s + whole + 1;
    ptrdiff_t fraction = e - f;
    if (fraction < 1 || fraction > 24 || whole + fraction > 19 || e - begin < 16) return 0;
    if (limit - f < 8) return 0;
    int tail = fraction > 16 ? 16 : (int)fraction, head = (int)fraction - tail;
    uint64_t low, u;
    if (!last_digits(e, tail, &low)) return 0;
    /* the fraction's first digits before its last 16 (none, or one for a float32's 17): read whether or not there
     * are any (f has eight bytes), so how many there are takes no branch */
    memcpy(&u, f, 8);
    if (leading_digits(u) < head) return 0;
    uint64_t high = swar_value(u, head ? head : 1) & (uint64_t)-(int64_t)(head != 0);
    uint64_t ones = whole == 1 ? (uint64_t)(s[0] - '0') : swar_value(v, whole);  /* mostly one digit */
    uint64_t w = (ones * POW10[head] + high) * POW10[tail] + low;
    int ok;
    *bits = decimal_bits(w, -fraction, &ok) | negative << 63;
    return ok;
}

/* The element in [s, e) (between two commas, or a bracket and a comma): one number, whitespace around it.  Loads
 * may look past e up to the span's end (limit).  A non-negative integer of up to eight digits (most ids) is read
 * from one load with no branch per digit, a plain decimal by plain_decimal(), any other number by number().  Always
 * inlined: read_flat calls it from four places, and GCC then stopped inlining it into the float loop (10-18% slower
 * floats). */
static inline __attribute__((always_inline)) int element(Sink *sink, const uchar *begin, const uchar *s,
                                                         const uchar *e, const uchar *limit) {
    while (s < e && is_space(*s)) s++;
    while (e > s && is_space(e[-1])) e--;
    ptrdiff_t len = e - s;
    if (len >= 1 && len <= 8 && limit - s >= 8 && !sink->floats && sink->n < sink->cap) {
        uint64_t v;
        memcpy(&v, s, 8);
        if (short_integer(v, (int)len)) {
            uint64_t value = swar_value(v, (int)len);
            memcpy(&sink->out[sink->n++], &value, sizeof value);
            return 1;
        }
    }
    if (len == 0) return 0;
    int64_t as_int;
    double as_double;
    uint64_t bits;
    if (plain_decimal(begin, s, e, limit, &bits)) {
        memcpy(&as_double, &bits, sizeof bits);
        return put(sink, FLOAT, 0, as_double);
    }
    const uchar *next = NULL;
    int kind = number(s, limit, &next, &as_int, &as_double);
    return next == e && put(sink, kind, as_int, as_double);
}

/* The ids of one 64-byte step at q (its commas: the bits of commas), while each is an integer of 1-8 digits with no
 * sign, no leading zero and at most one space before it: read from one load each, with none of element()'s other
 * cases (more whitespace, decimals, long integers).  Returns the commas left for element() (from the first element
 * that is otherwise) and where that element starts, by value: the caller's start stays in a register.  The caller
 * leaves room for 64 numbers and 8 bytes past q's last byte (loads start at most seven bytes before a comma). */
typedef struct {
    uint64_t commas;
    const uchar *start;
} Step;

static inline Step ids(Sink *sink, const uchar *q, uint64_t commas, const uchar *s) {
    uint64_t *out = sink->out + sink->n;
    Py_ssize_t k = 0;
    while (commas) {
        const uchar *comma = q + __builtin_ctzll(commas);
        const uchar *digit = s + (*s == ' ');  /* json.dumps' ", " (tritonclient's spelling) */
        uint64_t len = (uint64_t)(comma - digit), v;
        memcpy(&v, digit, 8);
        if (len - 1 > 7 || !short_integer(v, (int)len)) break;
        out[k++] = swar_value(v, (int)len);
        s = comma + 1;
        commas &= commas - 1;
    }
    sink->n += k;
    return (Step){commas, s};
}

/* The decimals of one 64-byte step at q while each is "-?d.d{1,18}" with at most one space before it (the repr of a
 * value under 10 in magnitude: most dense inputs), read as plain_decimal() reads them with fewer cases: one whole
 * digit, the fraction's last 16 digits at once (last_digits), any one or two before them.  As ids(): the commas left
 * for element() and where the next element starts.  Only once the sink holds doubles; loads reach 16 bytes before a
 * comma, so the first elements after begin go to element(). */
static inline Step decimals(Sink *sink, const uchar *begin, const uchar *q, uint64_t commas, const uchar *s) {
    uint64_t *out = sink->out + sink->n;
    Py_ssize_t k = 0;
    while (commas) {
        const uchar *comma = q + __builtin_ctzll(commas);
        const uchar *d = s + (*s == ' ');
        uint64_t negative = *d == '-';
        d += negative;
        const uchar *f = d + 2;
        ptrdiff_t fraction = comma - f;
        if (!is_digit(d[0]) || d[1] != '.' || fraction < 1 || fraction > 18 || comma - begin < 16) break;
        int tail = fraction > 16 ? 16 : (int)fraction, head = (int)fraction - tail;
        uint64_t low, high = 0;
        if (!last_digits(comma, tail, &low)) break;
        if (head) {  /* the fraction's first one or two digits, before its last 16 */
            unsigned a = (unsigned)(f[0] - '0'), b = (unsigned)(f[1] - '0');
            if (a > 9 || (head == 2 && b > 9)) break;
            high = head == 1 ? a : a * 10 + b;
        }
        int ok;
        uint64_t w = ((uint64_t)(d[0] - '0') * POW10[head] + high) * POW10[tail] + low;  /* <= 19 digits */
        uint64_t bits = decimal_bits(w, -fraction, &ok);
        if (!ok) break;
        out[k++] = bits | negative << 63;
        s = comma + 1;
        commas &= commas - 1;
    }
    sink->n += k;
    return (Step){commas, s};
}

/* A flat array "[n, n, ..., n]": its commas found 64 bytes at a time (comma_bits), then each element read from its
 * own start, so one number's parse never waits for the one before it; the common ids and decimals by ids() and
 * decimals(), the rest by element().  -2 where anything is not so (a nested array, a refusal): read_array then reads
 * it, or refuses it. */
static Py_ssize_t read_flat(const uchar *p, const uchar *end, Sink *sink) {
    const uchar *begin = p;
    while (p < end && is_space(*p)) p++;
    const uchar *close = end;
    while (close > p && is_space(close[-1])) close--;
    if (close - p < 2 || *p != '[' || close[-1] != ']') return -2;
    close--;
    const uchar *start = ++p;
    const uchar *q = p;
    /* ids first, 64 bytes a step while every element is a short integer (ids()); from the first other element
     * (its step finished below) on, every number by element(), after decimals() in a float array */
    for (; close - q >= 64 && end - q >= 72 && sink->cap - sink->n >= 64; q += 64) {
        Step left = ids(sink, q, comma_bits(q), start);
        start = left.start;
        if (left.commas) {  /* the rest of this step by element(), then on from the next */
            for (uint64_t commas = left.commas; commas; commas &= commas - 1) {
                const uchar *comma = q + __builtin_ctzll(commas);
                if (!element(sink, begin, start, comma, end)) return -2;
                start = comma + 1;
            }
            q += 64;
            break;
        }
    }
    for (; close - q >= 64; q += 64) {
        uint64_t commas = comma_bits(q);
        if (sink->floats && sink->cap - sink->n >= 64) {  /* a float array: its common decimals first */
            Step left = decimals(sink, begin, q, commas, start);
            commas = left.commas;
            start = left.start;
        }
        while (commas) {
            const uchar *comma = q + __builtin_ctzll(commas);
            if (!element(sink, begin, start, comma, end)) return -2;
            start = comma + 1;
            commas &= commas - 1;
        }
    }
    for (; q < close; q++) {
        if (*q != ',') continue;
        if (!element(sink, begin, start, q, end)) return -2;
        start = q + 1;
    }
    if (!element(sink, begin, start, close, end)) return -2;
    return sink->n;
}

/* Any array of numbers, nested or not, one byte after another: the count, or -1 when refused; *nested: whether an
 * array was met inside it (the caller checks such a one is regular, as numpy needs). */
static Py_ssize_t read_array(const uchar *p, const uchar *end, Sink *sink, int *nested) {
    int depth = 0;
    p = skip_space(p, end);
    if (p >= end || *p != '[') return -1;
    p++;
    depth = 1;
    for (;;) {  /* a value is expected: a nested array or a number */
        p = skip_space(p, end);
        if (p < end && *p == '[') {
            if (++depth > 64) return -1;
            *nested = 1;
            p++;
            continue;
        }
        int64_t as_int;
        double as_double;
        const uchar *next;
        int kind = number(p, end, &next, &as_int, &as_double);  /* before put() reads as_int and as_double */
        if (!put(sink, kind, as_int, as_double)) return -1;
        p = skip_space(next, end);
        while (p < end && *p == ']') {  /* closing arrays */
            depth--;
            p = skip_space(p + 1, end);
            if (depth == 0) return p == end ? sink->n : -1;
        }
        if (p >= end || *p != ',') return -1;
        p++;
    }
}

static PyObject *parse(PyObject *self, PyObject *args) {
    Py_buffer src, out;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*w*", &src, &out)) return NULL;
    Sink sink = {(uint64_t *)out.buf, 0, out.len / 8, 0};
    const uchar *begin = (const uchar *)src.buf, *end = begin + src.len;
    Py_ssize_t n;
    int nested = 0;
    Py_BEGIN_ALLOW_THREADS
    n = read_flat(begin, end, &sink);
    if (n == -2) {  /* nested, or refused: read again from the start, one byte after another */
        sink.n = 0;
        sink.floats = 0;
        n = read_array(begin, end, &sink, &nested);
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    if (n <= 0) Py_RETURN_NONE;
    return Py_BuildValue("(nOO)", n, sink.floats ? Py_True : Py_False, nested ? Py_True : Py_False);
}

/* Commas in [p, end), plus one: the most numbers an array there can hold, so its array is sized exactly. */
static Py_ssize_t slots(const uchar *p, const uchar *end) {
    Py_ssize_t n = 1;
#ifdef __SSE2__
    const __m128i comma = _mm_set1_epi8(',');
    while (end - p >= 16) {  /* byte counters (a compare is -1 per comma), summed every 255 steps before they wrap */
        __m128i counts = _mm_setzero_si128();
        for (int steps = 0; end - p >= 16 && steps < 255; p += 16, steps++)
            counts = _mm_sub_epi8(counts, _mm_cmpeq_epi8(_mm_loadu_si128((const __m128i *)p), comma));
        __m128i sums = _mm_sad_epu8(counts, _mm_setzero_si128());
        n += _mm_cvtsi128_si32(sums) + _mm_extract_epi16(sums, 4);
    }
#else
    for (; end - p >= 64; p += 64) n += __builtin_popcountll(comma_bits(p));
#endif
    for (; p < end; p++) n += *p == ',';
    return n;
}

static PyObject *room(PyObject *self, PyObject *args) {
    Py_buffer src;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    Py_ssize_t n;
    Py_BEGIN_ALLOW_THREADS
    n = slots((const uchar *)src.buf, (const uchar *)src.buf + src.len);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&src);
    return PyLong_FromSsize_t(n);
}

/* From p, the first '"' or '}' (end if none), with the commas before it in *commas and whether a backslash came
 * before it in *backslash: one pass over a data array's bytes where SSE2 is (16 bytes a step, byte counters summed
 * before they wrap), else memchr and slots(). */
static const uchar *array_stop(const uchar *p, const uchar *end, Py_ssize_t *commas, int *backslash) {
#ifdef __SSE2__
    const __m128i comma = _mm_set1_epi8(','), quote = _mm_set1_epi8('"'), brace = _mm_set1_epi8('}'),
                  escape = _mm_set1_epi8('\\');
    Py_ssize_t n = 0;
    *backslash = 0;
    while (end - p >= 16) {
        __m128i counts = _mm_setzero_si128();
        int steps = 0, stop = 0;
        __m128i v = _mm_setzero_si128();
        for (; end - p >= 16 && steps < 255; p += 16, steps++) {
            v = _mm_loadu_si128((const __m128i *)p);
            stop = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, brace)),
                                                  _mm_cmpeq_epi8(v, escape)));
            if (stop) break;
            counts = _mm_sub_epi8(counts, _mm_cmpeq_epi8(v, comma));
        }
        __m128i sums = _mm_sad_epu8(counts, _mm_setzero_si128());
        n += _mm_cvtsi128_si32(sums) + _mm_extract_epi16(sums, 4);
        if (stop) {  /* the first of '"', '}' or a backslash in this step: the commas before it, then bytes from it */
            int k = __builtin_ctz((unsigned)stop);
            n += __builtin_popcount((unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, comma)) & ((1u << k) - 1u));
            p += k;
            break;
        }
    }
    for (; p < end && *p != '"' && *p != '}'; p++) {
        if (*p == '\\') {  /* refused by the caller: no need to read on */
            *backslash = 1;
            break;
        }
        n += *p == ',';
    }
    *commas = n;
    return p;
#else
    const uchar *quote = memchr(p, '"', (size_t)(end - p)), *brace = memchr(p, '}', (size_t)(end - p));
    const uchar *stop = end;
    if (quote != NULL && quote < stop) stop = quote;
    if (brace != NULL && brace < stop) stop = brace;
    *backslash = memchr(p, '\\', (size_t)(stop - p)) != NULL;
    *commas = slots(p, stop) - 1;
    return stop;
#endif
}

/* Where each "data": [...] array of an infer request's JSON lies, as codec._data_spans finds them (a "data" string
 * that is no key is passed over; a "data" key holding no array, or an array with no closing bracket before the next
 * quote or brace, gives None), with the most numbers each can hold (room()), without copying the request out of its
 * receive buffer.  None too for a backslash anywhere (an escape may spell "data" otherwise).  Each array's bytes
 * are read once (array_stop); the bytes between them are searched for a backslash by memchr. */
static PyObject *data_spans(PyObject *self, PyObject *args) {
    Py_buffer src;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*", &src)) return NULL;
    const uchar *begin = (const uchar *)src.buf, *end = begin + src.len, *pos = begin;
    const uchar *checked = begin;  /* no backslash before this */
    PyObject *spans = PyList_New(0);
    if (spans == NULL) goto done;
    for (;;) {
        const uchar *k = memmem(pos, (size_t)(end - pos), "\"data\"", 6);
        if (k == NULL) break;
        const uchar *j = skip_space(k + 6, end);
        if (j >= end || *j != ':') {  /* a string "data" that is no key */
            pos = j;
            continue;
        }
        j = skip_space(j + 1, end);
        if (j >= end || *j != '[') goto refused;
        if (j > checked && memchr(checked, '\\', (size_t)(j - checked)) != NULL) goto refused;
        Py_ssize_t commas;
        int backslash;
        const uchar *stop = array_stop(j, end, &commas, &backslash);
        if (backslash) goto refused;
        checked = stop;
        const uchar *close = stop;
        while (close > j && close[-1] != ']') commas -= *--close == ',';
        if (close <= j) goto refused;
        PyObject *span = Py_BuildValue("(nnn)", (Py_ssize_t)(j - begin), (Py_ssize_t)(close - begin), commas + 1);
        if (span == NULL || PyList_Append(spans, span) < 0) {
            Py_XDECREF(span);
            Py_CLEAR(spans);
            goto done;
        }
        Py_DECREF(span);
        pos = close;
    }
    if (checked < end && memchr(checked, '\\', (size_t)(end - checked)) != NULL) goto refused;
    goto done;
refused:
    Py_CLEAR(spans);
    spans = Py_None;
    Py_INCREF(spans);
done:
    PyBuffer_Release(&src);
    return spans;
}

static PyMethodDef methods[] = {
    {"data_spans", data_spans, METH_VARARGS, "data_spans(src) -> [(start, end, room), ...] or None: the data arrays"},
    {"parse", parse, METH_VARARGS, "parse(src, out) -> (count, is_float, nested) or None: an array into out"},
    {"room", room, METH_VARARGS, "room(src) -> int: the most numbers src can hold (its commas plus one)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_json_arrays", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__json_arrays(void) { return PyModule_Create(&module); }
