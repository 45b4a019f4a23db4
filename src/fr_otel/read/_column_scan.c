/* The column builder's one pass over a dump's entry dicts, in C (optional speed-up).
 *
 * fr_otel.read.columns is the reference: this module only takes the canonical shape
 * (exact dicts, tuples, str, int, bool, None as a pickled dump holds them) and answers
 * None for anything else, so the pure-Python builder decides every unusual case and
 * the result never depends on whether the extension was built. It reads Python
 * objects already made by the restricted unpickler: no bytes are parsed here.
 *
 * scan(entries, gloo, call_ids, new_call_id) -> None | (groups, done, latest, group_tuples, ids)
 *   groups: one tuple per group name, in first-appearance order:
 *     (first group tuple, positions, seq, created, fingerprint, done, is_p2p, seq is first..first+n-1)
 *     positions/seq/created/fingerprint are native int64 bytes (array('q')), done/is_p2p 0/1 bytes,
 *     each in record order within the group;
 *   done: 0/1 per entry in record order; latest: the largest time_created_ns (0 if none);
 *   group_tuples: every distinct (name, desc) met (the caller checks they are printable);
 *   ids: the distinct fingerprint ids, or None when there are over MAX_DISTINCT.
 *   call_ids: dict, canonical call bytes -> fingerprint id (this process's cache);
 *   new_call_id(call) -> id for a call not in it (the Python path's checks and id; ValueError when
 *   malformed or too large).
 *   It is fr-otel's own function over plain data: no Python code that could change the
 *   entries runs during the scan, so borrowed references into them stay valid.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_CALL_BYTES (1 << 20) /* as columns._MAX_CALL_BYTES: larger goes to the Python path */
#define MAX_CALL_NODES 65536     /* values visited per call: a shared-list bomb stops here */
#define MAX_DEPTH 3              /* field -> tensor -> dim */
#define MAX_DISTINCT 256         /* distinct fingerprint ids listed per scan */

/* The fields read per entry; the five call fields last, in the fingerprint's order. */
enum { F_GROUP, F_SEQ, F_CREATED, F_P2P, F_DONE, F_CALL, N_FIELDS = F_CALL + 5 };
static const char *const FIELD_NAMES[2][N_FIELDS] = {
    {"process_group", "collective_seq_id", "time_created_ns", "is_p2p", "state",
     "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes"},
    {"process_group", "collective_seq_id", "time_created_ns", "is_p2p", "retired",
     "profiling_name", "input_sizes", "input_dtypes", "output_sizes", "output_dtypes"},
};
static PyObject *field_keys[2][N_FIELDS]; /* [gloo][field], interned */
static PyObject *s_completed;

/* The key objects the entries use, and where each sits in an entry. A pickle shares one str
   object per distinct key, and one writer puts the keys of every entry in the same order: once
   learnt from an entry, a field is read at its slot (PyDict_Next from there) when the key found
   there is that very object, else looked up (a lookup with the learnt key ends at the identity
   test instead of comparing strings). Borrowed from the entries, which the scan keeps alive and
   unchanged. */
typedef struct {
    int learnt;
    PyObject *key[N_FIELDS];
    Py_ssize_t slot[N_FIELDS]; /* -1: not learnt */
} Keys;

/* 0 = ok (missing fields are NULL), -1 = error set */
static int read_fields(PyObject *e, Keys *keys, PyObject **val) {
    for (int f = 0; f < N_FIELDS; f++) {
        Py_ssize_t pos = keys->slot[f];
        PyObject *k, *v;
        if (pos >= 0 && PyDict_Next(e, &pos, &k, &v) && k == keys->key[f]) {
            val[f] = v;
            continue;
        }
        val[f] = PyDict_GetItemWithError(e, keys->key[f]);
        if (!val[f] && PyErr_Occurred()) return -1;
    }
    if (!keys->learnt) {
        Py_ssize_t pos = 0, at = 0;
        PyObject *k, *v;
        keys->learnt = 1;
        while (PyDict_Next(e, &pos, &k, &v)) {
            for (int f = 0; f < N_FIELDS; f++)
                if (v == val[f] && PyUnicode_CheckExact(k) && PyUnicode_Compare(k, keys->key[f]) == 0) {
                    keys->key[f] = k;
                    keys->slot[f] = at;
                }
            at = pos;
        }
    }
    return 0;
}

#define RECENT_CALLS 16
#define RECENT_CALL_BYTES 240
typedef struct {
    Py_ssize_t len; /* 0: empty (no encoding is empty) */
    uint64_t hash;
    int64_t id;
    char bytes[RECENT_CALL_BYTES];
} RecentCall;

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
    Py_ssize_t nodes;
    RecentCall recent[RECENT_CALLS];
} Encoder;

/* 0 = ok, 1 = not canonical (give up: Python path), -1 = Python error set */
static int put(Encoder *w, const void *p, Py_ssize_t n) {
    if (w->len + n > MAX_CALL_BYTES) return 1;
    if (w->len + n > w->cap) {
        Py_ssize_t cap = w->cap ? w->cap : 256;
        while (cap < w->len + n) cap *= 2;
        char *b = PyMem_Realloc(w->buf, (size_t)cap);
        if (!b) { PyErr_NoMemory(); return -1; }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, (size_t)n);
    w->len += n;
    return 0;
}

static int put_tag_len(Encoder *w, char tag, Py_ssize_t n) {
    uint32_t n32 = (uint32_t)n;
    int r = put(w, &tag, 1);
    return r ? r : put(w, &n32, 4);
}

/* A canonical encoding of one call value: equal values give equal bytes, types told apart. */
static int encode(Encoder *w, PyObject *v, int depth) {
    if (++w->nodes > MAX_CALL_NODES || depth > MAX_DEPTH) return 1;
    if (v == Py_None) return put(w, "N", 1);
    if (PyUnicode_CheckExact(v)) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(v, &n);
        if (!s) { PyErr_Clear(); return 1; } /* e.g. a lone surrogate */
        int r = put_tag_len(w, 'S', n);
        return r ? r : put(w, s, n);
    }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow) return 1;
        if (x == -1 && PyErr_Occurred()) return -1;
        int r = put(w, "I", 1);
        return r ? r : put(w, &x, 8);
    }
    int is_list = PyList_CheckExact(v);
    if (is_list || PyTuple_CheckExact(v)) {
        Py_ssize_t n = is_list ? PyList_GET_SIZE(v) : PyTuple_GET_SIZE(v);
        if (n > MAX_CALL_NODES) return 1;
        int r = put_tag_len(w, is_list ? 'L' : 'T', n);
        /* a list may change size while we walk it only through Python code, and none runs here */
        for (Py_ssize_t i = 0; !r && i < n; i++)
            r = encode(w, is_list ? PyList_GET_ITEM(v, i) : PyTuple_GET_ITEM(v, i), depth + 1);
        return r;
    }
    return 1; /* bool, float, dict, bytes...: the Python path decides */
}

/* A 0/1 flag: a bool or the int 0 or 1 (what bytes() and the range check accept). */
static int flag(PyObject *v, uint8_t *out) {
    if (v == Py_True) { *out = 1; return 0; }
    if (v == Py_False) { *out = 0; return 0; }
    if (PyLong_CheckExact(v)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (!overflow && (x == 0 || x == 1)) { *out = (uint8_t)x; return 0; }
        if (x == -1 && PyErr_Occurred()) PyErr_Clear();
    }
    return 1;
}

/* A non-negative int64 (not a bool). */
static int count(PyObject *v, int64_t *out) {
    if (!PyLong_CheckExact(v)) return 1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) { PyErr_Clear(); return 1; }
    if (overflow || x < 0) return 1;
    *out = (int64_t)x;
    return 0;
}

typedef struct {
    Py_ssize_t n;
    int64_t *seq, *created, *fp;
    int32_t *group;
    uint8_t *done, *p2p;
} Columns;

static void columns_free(Columns *c) {
    PyMem_Free(c->seq); PyMem_Free(c->created); PyMem_Free(c->fp);
    PyMem_Free(c->group); PyMem_Free(c->done); PyMem_Free(c->p2p);
}

static int columns_alloc(Columns *c, Py_ssize_t n) {
    size_t m = n ? (size_t)n : 1;
    c->n = n;
    c->seq = PyMem_Malloc(m * 8); c->created = PyMem_Malloc(m * 8); c->fp = PyMem_Malloc(m * 8);
    c->group = PyMem_Malloc(m * 4); c->done = PyMem_Malloc(m); c->p2p = PyMem_Malloc(m);
    if (!c->seq || !c->created || !c->fp || !c->group || !c->done || !c->p2p) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* The entry's fingerprint id: the cached id of its call's canonical bytes, else new_call_id(call). */
static int call_id(Encoder *w, PyObject *const *call, PyObject *ids, PyObject *new_id, int64_t *out) {
    w->len = 0;
    w->nodes = 0;
    for (int i = 0; i < 5; i++) {
        if (!call[i]) return 1;
        int r = encode(w, call[i], 1);
        if (r) return r;
    }
    /* A dump repeats a handful of calls: most entries end in this per-scan cache, before any
       bytes object or dict lookup. */
    uint64_t h = (uint64_t)w->len, word;
    Py_ssize_t i = 0;
    for (; i + 8 <= w->len; i += 8) {
        memcpy(&word, w->buf + i, 8);
        h = (h ^ word) * 0x9E3779B97F4A7C15ULL;
    }
    for (; i < w->len; i++) h = (h ^ (unsigned char)w->buf[i]) * 0x100000001B3ULL;
    h ^= h >> 29;
    RecentCall *slot = &w->recent[h % RECENT_CALLS];
    if (slot->len == w->len && slot->hash == h && memcmp(slot->bytes, w->buf, (size_t)w->len) == 0) {
        *out = slot->id;
        return 0;
    }
    PyObject *key = PyBytes_FromStringAndSize(w->buf, w->len);
    if (!key) return -1;
    PyObject *id = PyDict_GetItemWithError(ids, key); /* borrowed */
    if (id) {
        Py_INCREF(id);
    } else if (PyErr_Occurred()) {
        Py_DECREF(key);
        return -1;
    } else {
        PyObject *tuple = PyTuple_Pack(5, call[0], call[1], call[2], call[3], call[4]);
        id = tuple ? PyObject_CallOneArg(new_id, tuple) : NULL;
        Py_XDECREF(tuple);
        if (!id) {
            Py_DECREF(key);
            if (PyErr_ExceptionMatches(PyExc_ValueError)) { PyErr_Clear(); return 1; } /* malformed */
            return -1;
        }
        if (PyDict_SetItem(ids, key, id) < 0) { Py_DECREF(key); Py_DECREF(id); return -1; }
    }
    Py_DECREF(key);
    int r = count(id, out) ? (PyErr_Occurred() ? -1 : 1) : 0;
    Py_DECREF(id);
    if (!r && w->len <= RECENT_CALL_BYTES) {
        slot->len = w->len;
        slot->hash = h;
        slot->id = *out;
        memcpy(slot->bytes, w->buf, (size_t)w->len);
    }
    return r;
}

/* One pass over the entries into columns; the group of each entry by name (first-appearance order). */
static int read_columns(PyObject *entries, int gloo, PyObject *ids, PyObject *new_id, Columns *c,
                        PyObject *first_tuples /* list, per name */, PyObject *by_tuple, PyObject *by_name) {
    Encoder w = {0};
    int r = 0;
    PyObject *last_tuple = NULL;
    int32_t last_group = -1;
    Keys keys = {0};
    PyObject *val[N_FIELDS];
    memcpy(keys.key, field_keys[gloo ? 1 : 0], sizeof keys.key);
    for (int f = 0; f < N_FIELDS; f++) keys.slot[f] = -1;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    for (Py_ssize_t i = 0; !r && i < n; i++) {
        if (i >= PyList_GET_SIZE(entries)) { r = 1; break; } /* only if new_call_id broke its promise */
        PyObject *e = PyList_GET_ITEM(entries, i);
        if (!PyDict_CheckExact(e)) { r = 1; break; }
        if (read_fields(e, &keys, val) < 0) { r = -1; break; }
        PyObject *g = val[F_GROUP];
        if (!g) { r = 1; break; }
        /* Each entry has its own tuple, but a pickle shares its strings: same items, same group. */
        if (g != last_tuple && !(last_tuple && PyTuple_CheckExact(g) && PyTuple_GET_SIZE(g) == 2
                                 && PyTuple_GET_ITEM(g, 0) == PyTuple_GET_ITEM(last_tuple, 0)
                                 && PyTuple_GET_ITEM(g, 1) == PyTuple_GET_ITEM(last_tuple, 1))) {
            if (!PyTuple_CheckExact(g) || PyTuple_GET_SIZE(g) != 2 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(g, 0))
                || !PyUnicode_CheckExact(PyTuple_GET_ITEM(g, 1))) { r = 1; break; }
            PyObject *known = PyDict_GetItemWithError(by_tuple, g);
            if (!known) {
                if (PyErr_Occurred()) { r = -1; break; }
                PyObject *name = PyTuple_GET_ITEM(g, 0);
                known = PyDict_GetItemWithError(by_name, name);
                if (!known) {
                    if (PyErr_Occurred()) { r = -1; break; }
                    PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(first_tuples));
                    if (!index || PyDict_SetItem(by_name, name, index) < 0 || PyList_Append(first_tuples, g) < 0) {
                        Py_XDECREF(index); r = -1; break;
                    }
                    Py_DECREF(index);
                    known = PyDict_GetItemWithError(by_name, name);
                }
                if (!known || PyDict_SetItem(by_tuple, g, known) < 0) { r = -1; break; }
            }
            last_tuple = g;
            last_group = (int32_t)PyLong_AsLong(known);
        }
        c->group[i] = last_group;
        if (!val[F_SEQ] || count(val[F_SEQ], &c->seq[i])) { r = 1; break; }
        if (!val[F_CREATED] || count(val[F_CREATED], &c->created[i])) { r = 1; break; }
        if (!val[F_P2P]) c->p2p[i] = 0; /* optional: False */
        else if (flag(val[F_P2P], &c->p2p[i])) { r = 1; break; }
        PyObject *v = val[F_DONE];
        if (!v) c->done[i] = 0; /* optional: retired False, state "scheduled" */
        else if (gloo) {
            if (flag(v, &c->done[i])) { r = 1; break; }
        } else if (!PyUnicode_CheckExact(v)) {
            r = 1; break;
        } else {
            int eq = PyUnicode_Compare(v, s_completed);
            if (eq == -1 && PyErr_Occurred()) { r = -1; break; }
            c->done[i] = eq == 0;
        }
        r = call_id(&w, val + F_CALL, ids, new_id, &c->fp[i]);
    }
    PyMem_Free(w.buf);
    return r;
}

static PyObject *bytes_of(const void *p, Py_ssize_t n) { return PyBytes_FromStringAndSize(p, n); }

/* Each group's columns, record order kept: one counting sort by group. */
static PyObject *split(Columns *c, PyObject *first_tuples) {
    Py_ssize_t n = c->n, k = PyList_GET_SIZE(first_tuples);
    Py_ssize_t *start = PyMem_Calloc((size_t)k + 1, sizeof(Py_ssize_t));
    int64_t *pos = PyMem_Malloc((n ? (size_t)n : 1) * 8), *seq = PyMem_Malloc((n ? (size_t)n : 1) * 8);
    int64_t *created = PyMem_Malloc((n ? (size_t)n : 1) * 8), *fp = PyMem_Malloc((n ? (size_t)n : 1) * 8);
    uint8_t *done = PyMem_Malloc(n ? (size_t)n : 1), *p2p = PyMem_Malloc(n ? (size_t)n : 1);
    PyObject *out = NULL;
    if (!start || !pos || !seq || !created || !fp || !done || !p2p) { PyErr_NoMemory(); goto end; }
    for (Py_ssize_t i = 0; i < n; i++) start[c->group[i] + 1]++;
    for (Py_ssize_t g = 0; g < k; g++) start[g + 1] += start[g];
    Py_ssize_t *fill = PyMem_Malloc(((size_t)k + 1) * sizeof(Py_ssize_t));
    if (!fill) { PyErr_NoMemory(); goto end; }
    memcpy(fill, start, ((size_t)k + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t at = fill[c->group[i]]++;
        pos[at] = i; seq[at] = c->seq[i]; created[at] = c->created[i]; fp[at] = c->fp[i];
        done[at] = c->done[i]; p2p[at] = c->p2p[i];
    }
    PyMem_Free(fill);
    out = PyList_New(k);
    if (!out) goto end;
    for (Py_ssize_t g = 0; g < k; g++) {
        Py_ssize_t lo = start[g], m = start[g + 1] - lo;
        int run = 1; /* seq first, first+1, ...: the caller keeps it as a range */
        for (Py_ssize_t j = 1; run && j < m; j++) run = seq[lo + j] - seq[lo] == j;
        PyObject *item = Py_BuildValue(
            "(ONNNNNNO)", PyList_GET_ITEM(first_tuples, g), bytes_of(pos + lo, m * 8), bytes_of(seq + lo, m * 8),
            bytes_of(created + lo, m * 8), bytes_of(fp + lo, m * 8), bytes_of(done + lo, m), bytes_of(p2p + lo, m),
            run ? Py_True : Py_False);
        if (!item) { Py_CLEAR(out); goto end; }
        PyList_SET_ITEM(out, g, item);
    }
end:
    PyMem_Free(start); PyMem_Free(pos); PyMem_Free(seq); PyMem_Free(created); PyMem_Free(fp);
    PyMem_Free(done); PyMem_Free(p2p);
    return out;
}

static PyObject *scan(PyObject *Py_UNUSED(self), PyObject *args) {
    PyObject *entries, *ids, *new_id;
    int gloo;
    if (!PyArg_ParseTuple(args, "O!pO!O:scan", &PyList_Type, &entries, &gloo, &PyDict_Type, &ids, &new_id))
        return NULL;
    if (!PyList_CheckExact(entries) || !PyDict_CheckExact(ids)) Py_RETURN_NONE;
    Py_INCREF(entries); /* kept alive while Python code (new_call_id) may run */
    Columns c = {0};
    PyObject *first_tuples = PyList_New(0), *by_tuple = PyDict_New(), *by_name = PyDict_New(), *result = NULL;
    if (!first_tuples || !by_tuple || !by_name || columns_alloc(&c, PyList_GET_SIZE(entries)) < 0) goto end;
    int r = read_columns(entries, gloo, ids, new_id, &c, first_tuples, by_tuple, by_name);
    if (r < 0) goto end;
    if (r > 0) { result = Py_NewRef(Py_None); goto end; }
    int64_t latest = 0;
    for (Py_ssize_t i = 0; i < c.n; i++) if (c.created[i] > latest) latest = c.created[i];
    /* The distinct fingerprint ids (a dump repeats a handful; more than MAX_DISTINCT: None, the
       caller counts them itself). */
    int64_t distinct[MAX_DISTINCT];
    Py_ssize_t n_distinct = 0;
    for (Py_ssize_t i = 0; i < c.n && n_distinct <= MAX_DISTINCT; i++) {
        if (i && c.fp[i] == c.fp[i - 1]) continue;
        Py_ssize_t j = 0;
        while (j < n_distinct && distinct[j] != c.fp[i]) j++;
        if (j == n_distinct) {
            if (n_distinct == MAX_DISTINCT) { n_distinct++; break; }
            distinct[n_distinct++] = c.fp[i];
        }
    }
    PyObject *ids_met = Py_NewRef(Py_None);
    if (n_distinct <= MAX_DISTINCT) {
        Py_DECREF(ids_met);
        ids_met = PyTuple_New(n_distinct);
        for (Py_ssize_t j = 0; ids_met && j < n_distinct; j++) {
            PyObject *id = PyLong_FromLongLong(distinct[j]);
            if (!id) { Py_CLEAR(ids_met); break; }
            PyTuple_SET_ITEM(ids_met, j, id);
        }
        if (!ids_met) goto end;
    }
    PyObject *groups = split(&c, first_tuples);
    if (!groups) { Py_DECREF(ids_met); goto end; }
    result = Py_BuildValue("(NNLNN)", groups, bytes_of(c.done, c.n), (long long)latest, PyDict_Keys(by_tuple),
                           ids_met);
end:
    columns_free(&c);
    Py_XDECREF(first_tuples); Py_XDECREF(by_tuple); Py_XDECREF(by_name);
    Py_DECREF(entries);
    return result;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS, "Entry dicts -> per-group columns, or None when any is not canonical."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_column_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__column_scan(void) {
    for (int g = 0; g < 2; g++)
        for (int f = 0; f < N_FIELDS; f++)
            if (!(field_keys[g][f] = PyUnicode_InternFromString(FIELD_NAMES[g][f]))) return NULL;
    if (!(s_completed = PyUnicode_InternFromString("completed"))) return NULL;
    return PyModule_Create(&module);
}
