/* The records of one Kafka record batch (message format v2), read in one C pass.
 *
 * kafka-python reads a fetched batch record by record in Python: some fifteen varint calls,
 * a DefaultRecord, then a ConsumerRecord per record (~8 us of the ~12.5 a plain
 * kafka-python consumer spends on a 5 KB record with four headers). topics/records.py
 * hands the body of each (checked, decompressed) batch here instead and gets back the same
 * ConsumerRecord tuples.
 *
 * A record (kafka.apache.org/documentation/#record):
 *   length varint, attributes int8, timestampDelta varlong, offsetDelta varint,
 *   keyLength varint, key, valueLength varint, value, headerCount varint,
 *   then per header: keyLength varint, key (UTF-8), valueLength varint, value.
 * Varints are zigzag-encoded. A negative key or value length is a null key or value.
 *
 * read_records(record_type, buffer, pos, count, base_offset, first_timestamp,
 *              max_timestamp, log_append_time, topic, partition, leader_epoch)
 *   -> (records, sizes, error)
 * `records`: the first records of the batch as `record_type` (a 13-field tuple type:
 * kafka-python's ConsumerRecord); `sizes`: each one's length; `error`: None when all
 * `count` records were read and they end exactly at the end of the buffer, else why the
 * next one could not be read (the caller hands out the records before it, then raises
 * CorruptRecordError, as kafka-python does). Header keys and header values equal to the
 * previous record's at the same place are shared, not copied.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FIELDS 13
#define CACHED_HEADERS 8

typedef struct {
    const unsigned char *buf;
    Py_ssize_t pos, end;
    const char *error; /* static text, set on the first failure */
} Reader;

static int varint(Reader *r, int64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->pos >= r->end) {
            r->error = "record runs past the end of its batch";
            return -1;
        }
        unsigned char b = r->buf[r->pos++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
            return 0;
        }
    }
    r->error = "varint out of int64 range";
    return -1;
}

/* `len` bytes at the reader's position, after checking they are there. */
static const unsigned char *take(Reader *r, int64_t len) {
    if (len > r->end - r->pos) {
        r->error = "record runs past the end of its batch";
        return NULL;
    }
    const unsigned char *p = r->buf + r->pos;
    r->pos += (Py_ssize_t)len;
    return p;
}

/* A bytes object for p[0:len], or a new reference to *cached when it holds the same bytes
 * (then it stays cached); a fresh one replaces the cache. */
static PyObject *shared_bytes(PyObject **cached, const unsigned char *p, Py_ssize_t len) {
    PyObject *c = *cached;
    if (c != NULL && PyBytes_GET_SIZE(c) == len && memcmp(PyBytes_AS_STRING(c), p, (size_t)len) == 0) {
        Py_INCREF(c);
        return c;
    }
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, len);
    if (b == NULL) return NULL;
    Py_XSETREF(*cached, b);
    Py_INCREF(b);
    return b;
}

/* The str of a header key, shared with the previous record's key at this place when equal;
 * NULL with Python's exception set (the caller names a UnicodeDecodeError as damage). */
static PyObject *shared_key(PyObject **raw, PyObject **text, const unsigned char *p, Py_ssize_t len) {
    PyObject *c = *raw;
    if (c != NULL && PyBytes_GET_SIZE(c) == len && memcmp(PyBytes_AS_STRING(c), p, (size_t)len) == 0) {
        Py_INCREF(*text);
        return *text;
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, len, "strict");
    if (s == NULL) return NULL;
    PyObject *b = PyBytes_FromStringAndSize((const char *)p, len);
    if (b == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    Py_XSETREF(*raw, b);
    Py_XSETREF(*text, s);
    Py_INCREF(s);
    return s;
}

static PyObject *nullable_bytes(Reader *r, int64_t *size) {
    int64_t len;
    if (varint(r, &len) < 0) return NULL;
    *size = len < 0 ? -1 : len;
    if (len < 0) Py_RETURN_NONE;
    const unsigned char *p = take(r, len);
    if (p == NULL) return NULL;
    return PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)len);
}

typedef struct {
    PyObject *key_raw[CACHED_HEADERS], *key_text[CACHED_HEADERS], *value[CACHED_HEADERS];
} HeaderCache;

static void cache_clear(HeaderCache *c) {
    for (int i = 0; i < CACHED_HEADERS; i++) {
        Py_CLEAR(c->key_raw[i]);
        Py_CLEAR(c->key_text[i]);
        Py_CLEAR(c->value[i]);
    }
}

/* The headers list of one record and their serialized size (-1 without headers). */
static PyObject *read_headers(Reader *r, HeaderCache *cache, int64_t *header_size) {
    int64_t count;
    if (varint(r, &count) < 0) return NULL;
    if (count < 0) {
        r->error = "negative number of record headers";
        return NULL;
    }
    if (count > r->end - r->pos) { /* each header takes at least two bytes: refuse before allocating */
        r->error = "more record headers than the record has bytes";
        return NULL;
    }
    PyObject *list = PyList_New((Py_ssize_t)count);
    if (list == NULL) return NULL;
    int64_t total = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t klen, vlen;
        const unsigned char *k, *v;
        PyObject *key = NULL, *value = NULL, *pair;
        if (varint(r, &klen) < 0) goto fail;
        if (klen < 0) {
            r->error = "negative header key length";
            goto fail;
        }
        if ((k = take(r, klen)) == NULL) goto fail;
        key = i < CACHED_HEADERS ? shared_key(&cache->key_raw[i], &cache->key_text[i], k, (Py_ssize_t)klen)
                                 : PyUnicode_DecodeUTF8((const char *)k, (Py_ssize_t)klen, "strict");
        if (key == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                r->error = "header key is not UTF-8";
            }
            goto fail;
        }
        if (varint(r, &vlen) < 0) goto fail_key;
        if (vlen < 0) {
            value = Py_NewRef(Py_None);
        } else {
            if ((v = take(r, vlen)) == NULL) goto fail_key;
            value = i < CACHED_HEADERS ? shared_bytes(&cache->value[i], v, (Py_ssize_t)vlen)
                                       : PyBytes_FromStringAndSize((const char *)v, (Py_ssize_t)vlen);
            if (value == NULL) goto fail_key;
            total += vlen;
        }
        total += klen;
        pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(value);
            goto fail_key;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyList_SET_ITEM(list, (Py_ssize_t)i, pair);
        continue;
    fail_key:
        Py_DECREF(key);
    fail:
        Py_DECREF(list);
        return NULL;
    }
    *header_size = count ? total : -1;
    return list;
}

static PyObject *read_records(PyObject *self, PyObject *args) {
    PyTypeObject *type;
    Py_buffer view;
    Py_ssize_t pos, count;
    long long base_offset, first_ts, max_ts;
    int log_append_time;
    PyObject *topic, *partition, *leader_epoch;
    if (!PyArg_ParseTuple(args, "O!y*nnLLLpOOO", &PyType_Type, &type, &view, &pos, &count, &base_offset, &first_ts,
                          &max_ts, &log_append_time, &topic, &partition, &leader_epoch))
        return NULL;
    PyObject *records = NULL, *sizes = NULL, *error = NULL, *result = NULL;
    HeaderCache cache;
    memset(&cache, 0, sizeof cache);
    if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a tuple type without extra slots (a namedtuple)");
        goto done;
    }
    if (pos < 0 || pos > view.len || count < 0) {
        PyErr_SetString(PyExc_ValueError, "position or count out of range");
        goto done;
    }
    PyObject *ts_type = PyLong_FromLong(log_append_time ? 1 : 0);
    if (ts_type == NULL) goto done;
    records = PyList_New(0);
    sizes = PyList_New(0);
    if (records == NULL || sizes == NULL) {
        Py_DECREF(ts_type);
        goto done;
    }
    Reader r = {(const unsigned char *)view.buf, pos, view.len, NULL};
    for (Py_ssize_t n = 0; n < count; n++) {
        int64_t length, ts_delta, offset_delta, key_size, value_size, header_size = -1;
        PyObject *key = NULL, *value = NULL, *headers = NULL, *rec;
        if (varint(&r, &length) < 0) break;
        if (length < 0 || length > r.end - r.pos) {
            r.error = "record length runs past the end of its batch";
            break;
        }
        Py_ssize_t start = r.pos;
        Reader body = {r.buf, r.pos, r.pos + (Py_ssize_t)length, NULL};
        if (take(&body, 1) == NULL || varint(&body, &ts_delta) < 0 || varint(&body, &offset_delta) < 0) {
            r.error = body.error;
            break;
        }
        if ((key = nullable_bytes(&body, &key_size)) == NULL) goto record_failed;
        if ((value = nullable_bytes(&body, &value_size)) == NULL) goto record_failed;
        if ((headers = read_headers(&body, &cache, &header_size)) == NULL) goto record_failed;
        if (body.pos != start + length) {
            body.error = "record's fields end before its length says";
            goto record_failed;
        }
        r.pos = body.pos;
        rec = type->tp_alloc(type, FIELDS);
        if (rec == NULL) goto record_failed;
        PyObject *items[FIELDS] = {
            Py_NewRef(topic), Py_NewRef(partition), Py_NewRef(leader_epoch),
            PyLong_FromLongLong((long long)((uint64_t)base_offset + (uint64_t)offset_delta)),
            PyLong_FromLongLong(log_append_time ? max_ts : (long long)((uint64_t)first_ts + (uint64_t)ts_delta)),
            Py_NewRef(ts_type), key, value, headers, Py_NewRef(Py_None),
            PyLong_FromLongLong(key_size), PyLong_FromLongLong(value_size), PyLong_FromLongLong(header_size)};
        key = value = headers = NULL; /* owned by items now */
        int ok = 1;
        for (int i = 0; i < FIELDS; i++) {
            if (items[i] == NULL) ok = 0;
            PyTuple_SET_ITEM(rec, i, items[i]);
        }
        PyObject *size = ok ? PyLong_FromLongLong(length) : NULL;
        if (size == NULL || PyList_Append(records, rec) < 0 || PyList_Append(sizes, size) < 0) {
            Py_XDECREF(size);
            Py_DECREF(rec);
            goto failed;
        }
        Py_DECREF(size);
        Py_DECREF(rec);
        continue;
    record_failed:
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        if (PyErr_Occurred()) goto failed;
        r.error = body.error;
        break;
    }
    if (r.error == NULL && PyList_GET_SIZE(records) < count) r.error = "record could not be read"; /* never silent */
    if (r.error == NULL && r.pos != r.end) r.error = "bytes left after the batch's last record";
    Py_DECREF(ts_type);
    if (r.error != NULL) {
        error = PyUnicode_FromString(r.error);
        if (error == NULL) goto done;
    } else {
        error = Py_NewRef(Py_None);
    }
    result = PyTuple_Pack(3, records, sizes, error);
    goto done;
failed:
    Py_DECREF(ts_type);
done:
    cache_clear(&cache);
    Py_XDECREF(records);
    Py_XDECREF(sizes);
    Py_XDECREF(error);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"read_records", read_records, METH_VARARGS,
     "read_records(record_type, buffer, pos, count, base_offset, first_timestamp, max_timestamp, "
     "log_append_time, topic, partition, leader_epoch) -> (records, sizes, error)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_recordreader",
                                    "Kafka record batch (v2) bodies read in C (topics/records.py).", -1, methods};

PyMODINIT_FUNC PyInit__recordreader(void) {
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "ABI", 1) < 0) Py_CLEAR(m);
    return m;
}
