/* fr_otel.read.pickle_keys's walk in C (optional speed-up): what a pickle would use as dict keys.
 *
 * key_problem(data) -> None | str
 *
 * fr_otel.read.pickle_keys.key_problem_in_python is the reference and its module doc says why:
 * every stack slot and memo entry is tracked only as SAFE (str, bytes, bool, an int of
 * |v| < 2**61 - 1) or OTHER; a dict getting an OTHER key, or any set, is refused; the walk
 * stops (accepting) wherever the real loader must stop. The messages are the reference's.
 * No Python object is made while walking: this is a loop over bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { SAFE = 0, OTHER = 1, UNSET = 2 };
enum { GO = 0, STOP = 1, REFUSE_KEY = 2, REFUSE_SET = 3, REFUSE_MEMO = 4, NO_MEMORY = 5 };

#define KEY_MESSAGE "a dict key that is not a string or a small integer (%s; dumps key their dicts by strings " \
                    "and small integers, and others can make loading take quadratic time)"
#define SET_MESSAGE "a set (dumps hold none, and a set of colliding values takes quadratic time)"
#define MEMO_MESSAGE "a memo index beyond the file's size, or written unreadably"

typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
    unsigned char *stack;
    Py_ssize_t n, cap;
    Py_ssize_t *marks;
    Py_ssize_t nmarks, capmarks;
    unsigned char *memo; /* UNSET where nothing was put */
    Py_ssize_t memocap, memolen;
    const char *where; /* the opcode that was refused */
} Walk;

static int grow(void **buf, Py_ssize_t *cap, Py_ssize_t need, size_t item, int fill) {
    if (need <= *cap)
        return 0;
    Py_ssize_t cap2 = *cap ? *cap : 64;
    while (cap2 < need)
        cap2 *= 2;
    void *b = realloc(*buf, (size_t)cap2 * item);
    if (!b)
        return -1;
    if (fill >= 0)
        memset((char *)b + (size_t)*cap * item, fill, (size_t)(cap2 - *cap) * item);
    *buf = b;
    *cap = cap2;
    return 0;
}

static inline int push(Walk *w, unsigned char tag) {
    if (w->n >= w->cap && grow((void **)&w->stack, &w->cap, w->n + 1, 1, -1) < 0)
        return NO_MEMORY;
    w->stack[w->n++] = tag;
    return GO;
}

static inline Py_ssize_t fence(const Walk *w) { return w->nmarks ? w->marks[w->nmarks - 1] : 0; }

/* The next n argument bytes (STOP when the data ends first). */
static inline int need(Walk *w, Py_ssize_t n, const unsigned char **arg) {
    if (n < 0 || n > w->end - w->pos)
        return STOP;
    *arg = w->p + w->pos;
    w->pos += n;
    return GO;
}

static inline uint64_t little(const unsigned char *a, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | a[i];
    return v;
}

/* A length-prefixed argument: n length bytes, then that many bytes. */
static inline int length(Walk *w, int n, int is_signed, Py_ssize_t *len) {
    const unsigned char *a;
    if (need(w, n, &a))
        return STOP;
    uint64_t v = little(a, n);
    if (is_signed && n == 4 && (v & 0x80000000u))
        return STOP;
    if (v > (uint64_t)(w->end - w->pos))
        return STOP;
    *len = (Py_ssize_t)v;
    w->pos += (Py_ssize_t)v;
    return GO;
}

/* A text line (protocol 0 arguments), without its newline. */
static int line(Walk *w, const unsigned char **text, Py_ssize_t *len) {
    const unsigned char *nl = memchr(w->p + w->pos, '\n', (size_t)(w->end - w->pos));
    if (!nl)
        return STOP;
    *text = w->p + w->pos;
    *len = nl - *text;
    w->pos = nl - w->p + 1;
    return GO;
}

/* SAFE when the little-endian two's complement int of n bytes has |v| < 2**61 - 1. */
static unsigned char long_tag(const unsigned char *a, Py_ssize_t n) {
    if (n == 0)
        return SAFE;
    int negative = a[n - 1] & 0x80;
    for (Py_ssize_t i = 8; i < n; i++) /* bytes past the 8th must only extend the sign */
        if (a[i] != (negative ? 0xFF : 0x00))
            return OTHER;
    int k = n < 8 ? (int)n : 8;
    uint64_t u = little(a, k);
    if (k < 8 && negative)
        u |= ~(uint64_t)0 << (8 * k);
    if (n > 8 && ((u >> 63) != (uint64_t)(negative ? 1 : 0)))
        return OTHER; /* the 9th byte's sign differs from the 8th's top bit: out of int64 */
    int64_t v = (int64_t)u;
    const int64_t limit = ((int64_t)1 << 61) - 1;
    return (v > -limit && v < limit) ? SAFE : OTHER;
}

/* 1 to 18 ASCII digits: a number below 2**61 - 1 in any base the loader may read it in. */
static int plain_digits(const unsigned char *t, Py_ssize_t len) {
    if (len < 1 || len > 18)
        return 0;
    for (Py_ssize_t i = 0; i < len; i++)
        if (t[i] < '0' || t[i] > '9')
            return 0;
    return 1;
}

/* INT / LONG text, as the reference: SAFE only for plain decimal digits (the loader reads it
   with strtol in base 0, and anything else might be large). */
static unsigned char text_int(const unsigned char *t, Py_ssize_t len) {
    if (len && t[0] == '-') {
        t++;
        len--;
    }
    return plain_digits(t, len) ? SAFE : OTHER;
}

/* A GET/PUT index written as text: plain digits, else refused (as the reference). */
static int text_index(const unsigned char *t, Py_ssize_t len, Py_ssize_t *index) {
    if (!plain_digits(t, len))
        return REFUSE_MEMO;
    Py_ssize_t v = 0;
    for (Py_ssize_t i = 0; i < len; i++)
        v = v * 10 + (t[i] - '0');
    *index = v;
    return GO;
}

static inline int put(Walk *w, Py_ssize_t index) {
    if (w->n <= fence(w))
        return STOP;
    if (index >= w->end)
        return REFUSE_MEMO;
    if (index >= w->memocap && grow((void **)&w->memo, &w->memocap, index + 1, 1, UNSET) < 0)
        return NO_MEMORY;
    if (w->memo[index] == UNSET)
        w->memolen++;
    w->memo[index] = w->stack[w->n - 1];
    return GO;
}

static inline int get(Walk *w, Py_ssize_t index) {
    if (index < 0 || index >= w->memocap || w->memo[index] == UNSET)
        return STOP;
    return push(w, w->memo[index]);
}

static int pop(Walk *w, Py_ssize_t k) {
    if (w->n - k < fence(w))
        return STOP;
    w->n -= k;
    return GO;
}

/* Pops to the last mark; its position in *at. */
static int pop_mark(Walk *w, Py_ssize_t *at) {
    if (!w->nmarks)
        return STOP;
    *at = w->marks[--w->nmarks];
    return GO;
}

/* Items stack[at:n] are key, value pairs. */
static int keys_ok(Walk *w, Py_ssize_t at, const char *what) {
    if ((w->n - at) % 2)
        return STOP;
    for (Py_ssize_t i = at; i < w->n; i += 2)
        if (w->stack[i] != SAFE) {
            w->where = what;
            return REFUSE_KEY;
        }
    return GO;
}

static int step(Walk *w) {
    const unsigned char *a;
    Py_ssize_t len, at;
    unsigned char op = w->p[w->pos++];
    int r;
    switch (op) {
    case 0x4B: /* BININT1 */
        return need(w, 1, &a) ? STOP : push(w, SAFE);
    case 0x4D: /* BININT2 */
        return need(w, 2, &a) ? STOP : push(w, SAFE);
    case 0x4A: /* BININT */
        return need(w, 4, &a) ? STOP : push(w, SAFE);
    case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
        return push(w, SAFE);
    case 0x58: /* BINUNICODE */
    case 0x42: /* BINBYTES */
        return length(w, 4, 0, &len) ? STOP : push(w, SAFE);
    case 0x54: /* BINSTRING */
        return length(w, 4, 1, &len) ? STOP : push(w, SAFE);
    case 0x8C: case 0x55: case 0x43: /* SHORT_BINUNICODE, SHORT_BINSTRING, SHORT_BINBYTES */
        return length(w, 1, 0, &len) ? STOP : push(w, SAFE);
    case 0x8D: case 0x8E: /* BINUNICODE8, BINBYTES8 */
        return length(w, 8, 0, &len) ? STOP : push(w, SAFE);
    case 0x56: case 0x53: /* UNICODE, STRING */
        return line(w, &a, &len) ? STOP : push(w, SAFE);
    case 0x68: /* BINGET */
        return need(w, 1, &a) ? STOP : get(w, a[0]);
    case 0x6A: /* LONG_BINGET */
        return need(w, 4, &a) ? STOP : get(w, (Py_ssize_t)little(a, 4));
    case 0x67: /* GET */
        if (line(w, &a, &len))
            return STOP;
        if ((r = text_index(a, len, &at)))
            return r;
        return get(w, at);
    case 0x71: /* BINPUT */
        return need(w, 1, &a) ? STOP : put(w, a[0]);
    case 0x72: /* LONG_BINPUT */
        return need(w, 4, &a) ? STOP : put(w, (Py_ssize_t)little(a, 4));
    case 0x70: /* PUT */
        if (line(w, &a, &len))
            return STOP;
        if ((r = text_index(a, len, &at)))
            return r;
        return put(w, at);
    case 0x94: /* MEMOIZE */
        return put(w, w->memolen);
    case 0x8A: /* LONG1 */
        if (length(w, 1, 0, &len))
            return STOP;
        return push(w, long_tag(w->p + w->pos - len, len));
    case 0x8B: /* LONG4 */
        if (length(w, 4, 1, &len))
            return STOP;
        return push(w, long_tag(w->p + w->pos - len, len));
    case 0x49: /* INT */
        if (line(w, &a, &len))
            return STOP;
        return push(w, text_int(a, len));
    case 0x4C: /* LONG: one trailing L is dropped */
        if (line(w, &a, &len))
            return STOP;
        return push(w, text_int(a, len && a[len - 1] == 'L' ? len - 1 : len));
    case 0x4E: case 0x29: case 0x5D: case 0x7D: /* NONE, EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT */
        return push(w, OTHER);
    case 0x47: /* BINFLOAT */
        return need(w, 8, &a) ? STOP : push(w, OTHER);
    case 0x96: /* BYTEARRAY8 */
        return length(w, 8, 0, &len) ? STOP : push(w, OTHER);
    case 0x46: /* FLOAT */
        return line(w, &a, &len) ? STOP : push(w, OTHER);
    case 0x28: /* MARK */
        if (grow((void **)&w->marks, &w->capmarks, w->nmarks + 1, sizeof(Py_ssize_t), -1) < 0)
            return NO_MEMORY;
        w->marks[w->nmarks++] = w->n;
        return GO;
    case 0x75: /* SETITEMS */
        if (pop_mark(w, &at) || at <= fence(w))
            return STOP;
        if ((r = keys_ok(w, at, "SETITEMS")))
            return r;
        w->n = at;
        return GO;
    case 0x73: /* SETITEM */
        if (w->n - 2 < fence(w))
            return STOP;
        at = w->n - 2;
        if (at <= fence(w))
            return STOP;
        if ((r = keys_ok(w, at, "SETITEM")))
            return r;
        w->n = at;
        return GO;
    case 0x64: /* DICT */
        if (pop_mark(w, &at))
            return STOP;
        if ((r = keys_ok(w, at, "DICT")))
            return r;
        w->n = at;
        return push(w, OTHER);
    case 0x65: /* APPENDS */
        if (pop_mark(w, &at) || at <= fence(w))
            return STOP;
        w->n = at;
        return GO;
    case 0x61: /* APPEND */
        if (pop(w, 1) || w->n <= fence(w))
            return STOP;
        return GO;
    case 0x74: case 0x6C: /* TUPLE, LIST */
        if (pop_mark(w, &at))
            return STOP;
        w->n = at;
        return push(w, OTHER);
    case 0x85: case 0x86: case 0x87: /* TUPLE1..3 */
        if (pop(w, op - 0x84))
            return STOP;
        return push(w, OTHER);
    case 0x30: /* POP */
        if (w->nmarks && w->marks[w->nmarks - 1] == w->n) {
            w->nmarks--;
            return GO;
        }
        return pop(w, 1);
    case 0x31: /* POP_MARK */
        if (pop_mark(w, &at))
            return STOP;
        w->n = at;
        return GO;
    case 0x32: /* DUP */
        if (w->n <= fence(w))
            return STOP;
        return push(w, w->stack[w->n - 1]);
    case 0x80: /* PROTO */
        return need(w, 1, &a);
    case 0x95: /* FRAME */
        return need(w, 8, &a);
    case 0x98: /* READONLY_BUFFER */
        return w->n <= fence(w) ? STOP : GO;
    case 0x8F: case 0x90: case 0x91: /* EMPTY_SET, ADDITEMS, FROZENSET */
        return REFUSE_SET;
    default: /* STOP, globals, persistent ids, REDUCE/BUILD/NEWOBJ..., buffers, unknown: the loader stops */
        return STOP;
    }
}

static PyObject *key_problem(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Walk w;
    memset(&w, 0, sizeof w);
    w.p = view.buf;
    w.end = view.len;
    int r = GO;
    while (r == GO && w.pos < w.end)
        r = step(&w); /* ~1.5 ns per byte of a real dump: a few % of loading it */
    free(w.stack);
    free(w.marks);
    free(w.memo);
    PyBuffer_Release(&view);
    switch (r) {
    case REFUSE_KEY:
        return PyUnicode_FromFormat(KEY_MESSAGE, w.where);
    case REFUSE_SET:
        return PyUnicode_FromString(SET_MESSAGE);
    case REFUSE_MEMO:
        return PyUnicode_FromString(MEMO_MESSAGE);
    case NO_MEMORY:
        return PyErr_NoMemory();
    default:
        Py_RETURN_NONE;
    }
}

static PyMethodDef methods[] = {
    {"key_problem", key_problem, METH_O,
     "Why loading this pickle could take quadratic time (see fr_otel.read.pickle_keys), or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_pickle_keys", NULL, -1, methods};

PyMODINIT_FUNC PyInit__pickle_keys(void) { return PyModule_Create(&module); }
