/* The row cache's key index (SDM §4.3: a memory-optimised cache index): int64 key -> int32 slot.
 *
 * The table is two arrays the caller owns (numpy: keys int64, EMPTY = -1, and vals int32, of one length), so it
 * pickles and is counted as plain arrays.  Open addressing with linear probing from a key's home position (a
 * splitmix64 mix of the key, reduced to the table's length by a multiply-shift) and backward-shift deletion, so
 * no tombstones build up.  Every function takes a whole batch of keys and runs without the GIL.  The caller keeps
 * the table under its load limit; a full table is reported, never looped over. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define EMPTY (-1LL)

static inline uint64_t mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline Py_ssize_t home(int64_t key, Py_ssize_t size) {
#ifdef __SIZEOF_INT128__
    return (Py_ssize_t)(((unsigned __int128)mix64((uint64_t)key) * (uint64_t)size) >> 64);
#else
    return (Py_ssize_t)(mix64((uint64_t)key) % (uint64_t)size);
#endif
}

static inline Py_ssize_t next(Py_ssize_t i, Py_ssize_t size) { return i + 1 == size ? 0 : i + 1; }

/* Position of ``key`` in the table, -1 if absent. */
static Py_ssize_t position(const int64_t *tk, Py_ssize_t size, int64_t key) {
    Py_ssize_t i = home(key, size);
    for (Py_ssize_t n = 0; n < size; n++) {
        if (tk[i] == key) return i;
        if (tk[i] == EMPTY) return -1;
        i = next(i, size);
    }
    return -1;
}

typedef struct {
    Py_buffer tk, tv, keys, other;
    Py_ssize_t size, n;
} Batch;

static void release(Batch *b) {
    PyBuffer_Release(&b->tk);
    PyBuffer_Release(&b->tv);
    PyBuffer_Release(&b->keys);
    if (b->other.obj != NULL) PyBuffer_Release(&b->other);
}

/* Parse (table keys, table vals, keys[, other]) and check their lengths; ``other_item``: the item size of the
 * fourth buffer (0: none), which must hold at least one item per key. */
static int parse(PyObject *args, Batch *b, Py_ssize_t other_item, int other_writable) {
    memset(b, 0, sizeof(*b));
    int ok = other_item == 0 ? PyArg_ParseTuple(args, "w*w*y*", &b->tk, &b->tv, &b->keys)
             : other_writable ? PyArg_ParseTuple(args, "w*w*y*w*", &b->tk, &b->tv, &b->keys, &b->other)
                              : PyArg_ParseTuple(args, "w*w*y*y*", &b->tk, &b->tv, &b->keys, &b->other);
    if (!ok) return 0;
    b->size = b->tk.len / 8;
    b->n = b->keys.len / 8;
    if (b->tk.len % 8 || b->tv.len != b->size * 4 || b->keys.len % 8 || b->size == 0) {
        PyErr_SetString(PyExc_ValueError, "table keys (int64) and vals (int32) of one non-zero length, int64 keys");
        release(b);
        return 0;
    }
    if (other_item && b->other.len < b->n * other_item) {
        PyErr_SetString(PyExc_ValueError, "the values or output buffer is shorter than the keys");
        release(b);
        return 0;
    }
    return 1;
}

static PyObject *find(PyObject *self, PyObject *args) {
    Batch b;
    if (!parse(args, &b, 8, 1)) return NULL;
    const int64_t *tk = b.tk.buf, *keys = b.keys.buf;
    const int32_t *tv = b.tv.buf;
    int64_t *out = b.other.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < b.n; j++) {
        Py_ssize_t i = keys[j] < 0 ? -1 : position(tk, b.size, keys[j]);
        out[j] = i < 0 ? -1 : tv[i];
    }
    Py_END_ALLOW_THREADS
    release(&b);
    Py_RETURN_NONE;
}

static PyObject *insert(PyObject *self, PyObject *args) {
    Batch b;
    if (!parse(args, &b, 4, 0)) return NULL;
    int64_t *tk = b.tk.buf;
    int32_t *tv = b.tv.buf;
    const int64_t *keys = b.keys.buf;
    const int32_t *vals = b.other.buf;
    Py_ssize_t added = 0, bad = -1;
    int full = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < b.n && bad < 0; j++)  /* a batch with a negative key inserts nothing */
        if (keys[j] < 0) bad = j;
    for (Py_ssize_t j = 0; j < b.n && bad < 0 && !full; j++) {
        int64_t key = keys[j];
        Py_ssize_t i = home(key, b.size), n = 0;
        for (; n < b.size; n++, i = next(i, b.size)) {
            if (tk[i] == key) break;
            if (tk[i] == EMPTY) {
                tk[i] = key;
                added++;
                break;
            }
        }
        if (n == b.size) full = 1;
        else tv[i] = vals[j];
    }
    Py_END_ALLOW_THREADS
    release(&b);
    if (bad >= 0)
        return PyErr_Format(PyExc_ValueError, "keys[%zd] is negative: keys are row ids, never negative", bad);
    if (full) return PyErr_Format(PyExc_OverflowError, "the index table is full");
    return PyLong_FromSsize_t(added);
}

static PyObject *remove_keys(PyObject *self, PyObject *args) {
    Batch b;
    if (!parse(args, &b, 0, 0)) return NULL;
    int64_t *tk = b.tk.buf;
    int32_t *tv = b.tv.buf;
    const int64_t *keys = b.keys.buf;
    Py_ssize_t removed = 0, size = b.size;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < b.n; j++) {
        Py_ssize_t i = keys[j] < 0 ? -1 : position(tk, size, keys[j]);
        if (i < 0) continue;
        /* backward shift: move each later key of the run into the hole unless its home lies cyclically in
         * (hole, its position], where it would no longer be found */
        Py_ssize_t j2 = i;
        for (Py_ssize_t n = 0; n < size; n++) {
            j2 = next(j2, size);
            if (tk[j2] == EMPTY) break;
            Py_ssize_t h = home(tk[j2], size);
            int stays = i <= j2 ? (h > i && h <= j2) : (h > i || h <= j2);
            if (!stays) {
                tk[i] = tk[j2];
                tv[i] = tv[j2];
                i = j2;
            }
        }
        tk[i] = EMPTY;
        removed++;
    }
    Py_END_ALLOW_THREADS
    release(&b);
    return PyLong_FromSsize_t(removed);
}

static PyMethodDef methods[] = {
    {"find", find, METH_VARARGS, "find(tkeys, tvals, keys, out): out[j] = the value of keys[j], -1 if absent"},
    {"insert", insert, METH_VARARGS, "insert(tkeys, tvals, keys, vals) -> keys added (present ones are updated)"},
    {"remove", remove_keys, METH_VARARGS, "remove(tkeys, tvals, keys) -> keys removed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_row_index", "The row cache's native key index.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__row_index(void) { return PyModule_Create(&module); }
