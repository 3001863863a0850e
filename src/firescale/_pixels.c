/* firescale._pixels: Caffe's planar (C, H, W) pixels interleaved into (H, W, C), row by row, without the GIL.
 *
 * Caffe stores an image as C planes of H rows (BGR for colour); TensorFlow wants each pixel's channels
 * side by side.  numpy does that interleave at a fraction of memory speed (its inner loop strides over
 * 3 channels), a plain C loop over one row at a time runs near it: the C source rows and the one
 * destination row of a record stay in L1 while they are combined.  Elements of 1, 2, 4 or 8 bytes are
 * moved as integers, so float32 pixels (Caffe's HDF5Data layout) go through the same loops bit-exactly.
 *
 *   interleave(src, dst, channels, height, width, offset=0, reverse=False)
 *       the records in `src` (from byte `offset`) into `dst`; as many records as `dst` holds.
 *   decode_raw_datums(values, header, dst, labels, channels, height, width, reverse=False) -> list
 *       a batch of raw uint8 Caffe Datums (header, pixels, 0x28 label varint, optional 0x38 0x00)
 *       copied and interleaved into `dst` with their labels into `labels` (int64), in one call; returns
 *       the positions whose bytes are laid out otherwise, for the caller's full decoder.
 *   decode_raw_datums_at(map, offsets, lengths, header, dst, labels, channels, height, width, reverse=False)
 *       the same for records lying in one buffer (a read-only map of data.mdb) at int64 `offsets` with
 *       int64 `lengths`, each checked to lie inside the buffer: one call per batch, no Python per record.
 *   gather(src, offsets, dst)
 *       row j of `dst` (N rows of equal size) copied from `src` at byte offsets[j] (int64), bounds-checked.
 *
 * The GIL is released around the loops once a call moves RELEASE_BYTES or more, so the tf.data thread
 * and the training thread run side by side; for less, taking the GIL back would cost more than the copy.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_SSSE3_PATH 1
#else
#define HAVE_SSSE3_PATH 0
#endif

#define RELEASE_BYTES (64 * 1024)
/* A batch call writing this many bytes or more writes three-channel uint8 rows with streaming stores:
 * an ordinary 16-byte store first reads the destination line it overwrites, which for a batch larger
 * than the caches doubles the memory traffic (glibc's memcpy avoids it with `rep movsb`, the
 * interleave cannot).  150 KB records at batch 256 (38 MB): 14.4 -> 9.6 ms a batch here.  Smaller
 * batches are written normally, so that one that fits in cache stays there for its consumer. */
#define STREAM_BYTES (16 * 1024 * 1024)
/* Raised whenever a function's arguments or results change, so that firescale.caffe.pixels can tell a
 * stale build (a .so left from older sources) from the one it was written for. */
#define KERNEL_VERSION 3

/* ---- the kernels -------------------------------------------------------------------------------- */

/* One record of `type` elements: plane p of `src` is channel k of `dst`, p = reverse ? C-1-k : k. */
#define DEFINE_RECORD_KERNEL(name, type)                                                              \
    static void name(const unsigned char *src_bytes, unsigned char *dst_bytes, Py_ssize_t c,         \
                     Py_ssize_t h, Py_ssize_t w, int reverse)                                         \
    {                                                                                                 \
        const type *src = (const type *)src_bytes;                                                    \
        type *dst = (type *)dst_bytes;                                                                \
        const Py_ssize_t plane = h * w;                                                               \
        for (Py_ssize_t y = 0; y < h; y++) {                                                          \
            type *row = dst + y * w * c;                                                              \
            if (c == 1) {                                                                             \
                memcpy(row, src + y * w, (size_t)w * sizeof(type));                                   \
            } else if (c == 3) {                                                                      \
                const type *p0 = src + (reverse ? 2 : 0) * plane + y * w;                             \
                const type *p1 = src + plane + y * w;                                                 \
                const type *p2 = src + (reverse ? 0 : 2) * plane + y * w;                             \
                for (Py_ssize_t x = 0; x < w; x++) {                                                  \
                    row[3 * x] = p0[x];                                                               \
                    row[3 * x + 1] = p1[x];                                                           \
                    row[3 * x + 2] = p2[x];                                                           \
                }                                                                                     \
            } else {                                                                                  \
                for (Py_ssize_t k = 0; k < c; k++) {                                                  \
                    const type *p = src + (reverse ? c - 1 - k : k) * plane + y * w;                  \
                    type *q = row + k;                                                                \
                    for (Py_ssize_t x = 0; x < w; x++)                                                \
                        q[x * c] = p[x];                                                              \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    }

DEFINE_RECORD_KERNEL(record_u8_plain, uint8_t)
DEFINE_RECORD_KERNEL(record_u16, uint16_t)
DEFINE_RECORD_KERNEL(record_u32, uint32_t)
DEFINE_RECORD_KERNEL(record_u64, uint64_t)

#if HAVE_SSSE3_PATH
/* Three byte planes into RGB triples, 16 pixels (48 bytes) at a time: each output vector gathers its
 * bytes from the three plane vectors with PSHUFB (Z = a zero byte) and ORs them.  GCC does not
 * vectorize the scalar loop above for 3 interleaved bytes, which leaves it at about a third of this. */
#define Z 0x80
static const uint8_t TRIPLE_MASKS[3][3][16] = {
    {{0, Z, Z, 1, Z, Z, 2, Z, Z, 3, Z, Z, 4, Z, Z, 5},
     {Z, 0, Z, Z, 1, Z, Z, 2, Z, Z, 3, Z, Z, 4, Z, Z},
     {Z, Z, 0, Z, Z, 1, Z, Z, 2, Z, Z, 3, Z, Z, 4, Z}},
    {{Z, Z, 6, Z, Z, 7, Z, Z, 8, Z, Z, 9, Z, Z, 10, Z},
     {5, Z, Z, 6, Z, Z, 7, Z, Z, 8, Z, Z, 9, Z, Z, 10},
     {Z, 5, Z, Z, 6, Z, Z, 7, Z, Z, 8, Z, Z, 9, Z, Z}},
    {{Z, 11, Z, Z, 12, Z, Z, 13, Z, Z, 14, Z, Z, 15, Z, Z},
     {Z, Z, 11, Z, Z, 12, Z, Z, 13, Z, Z, 14, Z, Z, 15, Z},
     {10, Z, Z, 11, Z, Z, 12, Z, Z, 13, Z, Z, 14, Z, Z, 15}},
};
#undef Z

__attribute__((target("ssse3"))) static void record_u8_triples_ssse3(
    const unsigned char *src, unsigned char *dst, Py_ssize_t h, Py_ssize_t w, int reverse, int stream)
{
    __m128i m[3][3];
    for (int j = 0; j < 3; j++)
        for (int k = 0; k < 3; k++)
            m[j][k] = _mm_loadu_si128((const __m128i *)TRIPLE_MASKS[j][k]);
    const Py_ssize_t plane = h * w;
    for (Py_ssize_t y = 0; y < h; y++) {
        const unsigned char *p0 = src + (reverse ? 2 : 0) * plane + y * w;
        const unsigned char *p1 = src + plane + y * w;
        const unsigned char *p2 = src + (reverse ? 0 : 2) * plane + y * w;
        unsigned char *row = dst + y * w * 3;
        const int aligned = stream && ((uintptr_t)row & 15) == 0;   /* streaming stores need 16-byte alignment */
        Py_ssize_t x = 0;
        for (; x + 16 <= w; x += 16) {
            __m128i a = _mm_loadu_si128((const __m128i *)(p0 + x));
            __m128i b = _mm_loadu_si128((const __m128i *)(p1 + x));
            __m128i c = _mm_loadu_si128((const __m128i *)(p2 + x));
            for (int j = 0; j < 3; j++) {
                __m128i v = _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, m[j][0]), _mm_shuffle_epi8(b, m[j][1])),
                                         _mm_shuffle_epi8(c, m[j][2]));
                if (aligned)
                    _mm_stream_si128((__m128i *)(row + 3 * x + 16 * j), v);
                else
                    _mm_storeu_si128((__m128i *)(row + 3 * x + 16 * j), v);
            }
        }
        for (; x < w; x++) {
            row[3 * x] = p0[x];
            row[3 * x + 1] = p1[x];
            row[3 * x + 2] = p2[x];
        }
    }
}
#endif

/* uint8 records, `stream` as STREAM_BYTES says: the SSSE3 path for three channels where the processor
 * has it, else the plain loops. */
static void record_u8_to(const unsigned char *src, unsigned char *dst, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w,
                         int reverse, int stream)
{
#if HAVE_SSSE3_PATH
    if (c == 3 && __builtin_cpu_supports("ssse3")) {
        record_u8_triples_ssse3(src, dst, h, w, reverse, stream);
        return;
    }
#endif
    (void)stream;
    record_u8_plain(src, dst, c, h, w, reverse);
}

static void record_u8(const unsigned char *src, unsigned char *dst, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w,
                      int reverse)
{
    record_u8_to(src, dst, c, h, w, reverse, 0);
}

/* After streaming stores: order them before anything the thread does next (handing the batch over). */
static void end_of_batch(int stream)
{
#if HAVE_SSSE3_PATH
    if (stream)
        _mm_sfence();
#else
    (void)stream;
#endif
}

typedef void (*record_kernel)(const unsigned char *, unsigned char *, Py_ssize_t, Py_ssize_t, Py_ssize_t, int);

static record_kernel kernel_for(Py_ssize_t itemsize)
{
    switch (itemsize) {
    case 1: return record_u8;
    case 2: return record_u16;
    case 4: return record_u32;
    case 8: return record_u64;
    default: return NULL;
    }
}

/* ---- argument checks ---------------------------------------------------------------------------- */

static int check_dims(Py_ssize_t c, Py_ssize_t h, Py_ssize_t w)
{
    if (c < 1 || h < 1 || w < 1) {
        PyErr_Format(PyExc_ValueError, "channels, height and width must be positive, got %zd, %zd and %zd", c, h, w);
        return -1;
    }
    if (c > PY_SSIZE_T_MAX / h || c * h > PY_SSIZE_T_MAX / w || c * h * w > PY_SSIZE_T_MAX / 8) {
        PyErr_SetString(PyExc_ValueError, "channels*height*width is too large");
        return -1;
    }
    return 0;
}

/* The format's type character, past any byte-order or alignment prefix; "B" when none is given. */
static char format_code(const Py_buffer *view)
{
    const char *f = view->format ? view->format : "B";
    while (*f == '@' || *f == '=' || *f == '<' || *f == '>' || *f == '!')
        f++;
    return *f;
}

static int overlaps(const Py_buffer *a, const Py_buffer *b)
{
    const char *a0 = a->buf, *b0 = b->buf;
    return a->len > 0 && b->len > 0 && a0 < b0 + b->len && b0 < a0 + a->len;
}

static int get_output(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a writable C-contiguous buffer (e.g. a numpy array), got %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

static int get_input(PyObject *obj, Py_buffer *view, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s must be a C-contiguous bytes-like object, got %.100s",
                     what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

/* ---- interleave --------------------------------------------------------------------------------- */

PyDoc_STRVAR(interleave_doc,
"interleave(src, dst, channels, height, width, offset=0, reverse=False)\n--\n\n"
"Interleave planar (N, C, H, W) elements of `src`, starting at byte `offset`, into `dst` as\n"
"(N, H, W, C); N is the number of records `dst` holds.  The element size is dst's item size (1, 2,\n"
"4 or 8 bytes); `src` is raw bytes or of dst's format.  With reverse=True plane C-1-k becomes\n"
"channel k (Caffe's BGR into RGB).  Raises ValueError for sizes that do not fit.");

static PyObject *interleave(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"src", "dst", "channels", "height", "width", "offset", "reverse", NULL};
    PyObject *src_obj, *dst_obj;
    Py_ssize_t c, h, w, offset = 0;
    int reverse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOnnn|np:interleave", keywords, &src_obj, &dst_obj,
                                     &c, &h, &w, &offset, &reverse))
        return NULL;
    if (check_dims(c, h, w) < 0)
        return NULL;
    Py_buffer dst, src;
    if (get_output(dst_obj, &dst, "dst") < 0)
        return NULL;
    if (get_input(src_obj, &src, "src") < 0) {
        PyBuffer_Release(&dst);
        return NULL;
    }
    PyObject *result = NULL;
    record_kernel kernel = kernel_for(dst.itemsize);
    Py_ssize_t record = c * h * w * dst.itemsize;
    if (kernel == NULL) {
        PyErr_Format(PyExc_ValueError, "dst has %zd-byte elements; 1, 2, 4 or 8 bytes are supported", dst.itemsize);
    } else if (src.itemsize != 1 && (src.itemsize != dst.itemsize || format_code(&src) != format_code(&dst))) {
        PyErr_Format(PyExc_ValueError, "src has format '%s' and dst '%s'; src must be raw bytes or of dst's format",
                     src.format ? src.format : "B", dst.format ? dst.format : "B");
    } else if (dst.len % record != 0) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, not a whole number of %zdx%zdx%zd records of %zd bytes",
                     dst.len, h, w, c, record);
    } else if (offset < 0 || offset > src.len || src.len - offset < dst.len) {
        PyErr_Format(PyExc_ValueError, "src holds %zd bytes; %zd records of %zd bytes from offset %zd need %zd",
                     src.len, dst.len / record, record, offset, offset + dst.len);
    } else if (overlaps(&src, &dst)) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap; the interleave needs a separate output buffer");
    } else {
        const unsigned char *in = (const unsigned char *)src.buf + offset;
        unsigned char *out = dst.buf;
        Py_ssize_t n = dst.len / record;
        if (dst.len >= RELEASE_BYTES) {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t i = 0; i < n; i++)
                kernel(in + i * record, out + i * record, c, h, w, reverse);
            Py_END_ALLOW_THREADS
        } else {
            for (Py_ssize_t i = 0; i < n; i++)
                kernel(in + i * record, out + i * record, c, h, w, reverse);
        }
        result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

/* The positions j < n with status[j] set, as a list (the records left to the caller's full decoder). */
static PyObject *flagged_positions(const char *status, Py_ssize_t n)
{
    PyObject *result = PyList_New(0);
    for (Py_ssize_t j = 0; result != NULL && j < n; j++) {
        if (!status[j])
            continue;
        PyObject *index = PyLong_FromSsize_t(j);
        if (index == NULL || PyList_Append(result, index) < 0)
            Py_CLEAR(result);
        Py_XDECREF(index);
    }
    return result;
}

/* The outputs of a batch decode: `dst` uint8 holding n records of c*h*w and `labels` int64 of n, apart.
 * Sets *have_dst / *have_labels as each buffer is acquired (the caller releases them); 0, or -1 with an error. */
static int get_batch_outputs(PyObject *dst_obj, Py_buffer *dst, int *have_dst, PyObject *labels_obj,
                             Py_buffer *labels, int *have_labels, Py_ssize_t n, Py_ssize_t c, Py_ssize_t h,
                             Py_ssize_t w)
{
    Py_ssize_t size = c * h * w;
    if (n > 0 && size > PY_SSIZE_T_MAX / n) {
        PyErr_SetString(PyExc_ValueError, "the batch is too large: records * channels*height*width overflows");
        return -1;
    }
    if (get_output(dst_obj, dst, "dst") < 0)
        return -1;
    *have_dst = 1;
    if (get_output(labels_obj, labels, "labels") < 0)
        return -1;
    *have_labels = 1;
    char code = format_code(labels);
    if (dst->itemsize != 1 || dst->len != n * size) {
        PyErr_Format(PyExc_ValueError, "dst must be uint8 holding %zd records of %zdx%zdx%zd (%zd bytes), "
                     "got %zd bytes of %zd-byte elements", n, h, w, c, n * size, dst->len, dst->itemsize);
        return -1;
    }
    if (labels->itemsize != 8 || !(code == 'q' || code == 'l') || labels->len != n * 8) {
        PyErr_Format(PyExc_ValueError, "labels must be int64 with %zd elements, got %zd bytes of format '%s'",
                     n, labels->len, labels->format ? labels->format : "B");
        return -1;
    }
    if (overlaps(dst, labels)) {
        PyErr_SetString(PyExc_ValueError, "dst and labels overlap");
        return -1;
    }
    return 0;
}

/* ---- decode_raw_datums -------------------------------------------------------------------------- */

/* The label of a raw Datum's tail (0x28 varint, then nothing or 0x38 0x00) as the wire format's
 * int32; 0 and the label on success, -1 for any other tail (left to the full decoder). */
static int tail_label(const unsigned char *tail, Py_ssize_t len, int64_t *label)
{
    if (len < 2 || tail[0] != 0x28)
        return -1;
    uint64_t value = 0;
    Py_ssize_t pos = 1;
    for (int shift = 0;; shift += 7) {
        if (pos >= len || shift >= 70)
            return -1;
        unsigned char byte = tail[pos++];
        if (shift < 64)
            value |= (uint64_t)(byte & 0x7F) << shift;
        if (!(byte & 0x80))
            break;
    }
    int64_t signed_value = (int64_t)value;
    if (signed_value < INT32_MIN || signed_value > INT32_MAX)
        return -1;
    Py_ssize_t rest = len - pos;
    if (!(rest == 0 || (rest == 2 && tail[pos] == 0x38 && tail[pos + 1] == 0x00)))
        return -1;
    *label = signed_value;
    return 0;
}

PyDoc_STRVAR(decode_raw_datums_doc,
"decode_raw_datums(values, header, dst, labels, channels, height, width, reverse=False) -> list\n--\n\n"
"For each bytes-like value j laid out as `header`, C*H*W planar uint8 pixels, 0x28 and the label's\n"
"varint, then nothing or 0x38 0x00 (a raw Datum as Caffe writes it): interleave the pixels into\n"
"record j of `dst` (uint8 (N, H, W, C)) and store the label in `labels[j]` (int64).  Returns the\n"
"positions j laid out otherwise; their rows are left untouched.");

static PyObject *decode_raw_datums(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"values", "header", "dst", "labels", "channels", "height", "width", "reverse", NULL};
    PyObject *values_obj, *dst_obj, *labels_obj;
    Py_buffer header;
    Py_ssize_t c, h, w;
    int reverse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Oy*OOnnn|p:decode_raw_datums", keywords, &values_obj, &header,
                                     &dst_obj, &labels_obj, &c, &h, &w, &reverse))
        return NULL;
    PyObject *result = NULL, *seq = NULL;
    Py_buffer dst = {0}, labels = {0};
    Py_buffer *views = NULL;
    char *status = NULL;
    Py_ssize_t n = 0, acquired = 0;
    int have_dst = 0, have_labels = 0;

    if (check_dims(c, h, w) < 0)
        goto done;
    Py_ssize_t size = c * h * w;
    seq = PySequence_Fast(values_obj, "values must be a sequence of bytes-like records");
    if (seq == NULL)
        goto done;
    n = PySequence_Fast_GET_SIZE(seq);
    if (get_batch_outputs(dst_obj, &dst, &have_dst, labels_obj, &labels, &have_labels, n, c, h, w) < 0)
        goto done;
    views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    status = PyMem_Calloc(n ? n : 1, 1);
    if (views == NULL || status == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; acquired < n; acquired++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, acquired);
        if (PyObject_GetBuffer(item, &views[acquired], PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "values[%zd] is not a contiguous bytes-like object (got %.100s)",
                         acquired, Py_TYPE(item)->tp_name);
            goto done;
        }
        if (overlaps(&views[acquired], &dst) || overlaps(&views[acquired], &labels)) {
            PyBuffer_Release(&views[acquired]);
            PyErr_Format(PyExc_ValueError, "values[%zd] overlaps dst or labels", acquired);
            goto done;
        }
    }
    {
        const unsigned char *head = header.buf;
        Py_ssize_t start = header.len, end = header.len + size;
        unsigned char *out = dst.buf;
        int64_t *label_out = labels.buf;
        PyThreadState *save = NULL;
        const int stream = n * size >= STREAM_BYTES;
        if (n * size >= RELEASE_BYTES)
            save = PyEval_SaveThread();
        for (Py_ssize_t j = 0; j < n; j++) {
            const unsigned char *value = views[j].buf;
            Py_ssize_t len = views[j].len;
            int64_t label;
            if (len < end + 2 || memcmp(value, head, (size_t)start) != 0
                || tail_label(value + end, len - end, &label) < 0) {
                status[j] = 1;
                continue;
            }
            record_u8_to(value + start, out + j * size, c, h, w, reverse, stream);
            label_out[j] = label;
        }
        end_of_batch(stream);
        if (save != NULL)
            PyEval_RestoreThread(save);
    }
    result = flagged_positions(status, n);
done:
    for (Py_ssize_t j = 0; j < acquired; j++)
        PyBuffer_Release(&views[j]);
    PyMem_Free(views);
    PyMem_Free(status);
    if (have_labels)
        PyBuffer_Release(&labels);
    if (have_dst)
        PyBuffer_Release(&dst);
    Py_XDECREF(seq);
    PyBuffer_Release(&header);
    return result;
}

/* ---- decode_raw_datums_at ----------------------------------------------------------------------- */

/* Decode records j of `map` at offsets[j], lengths[j] (bounds already checked); status[j] = 1 for a
 * record laid out otherwise. */
static void decode_at(const unsigned char *base, const int64_t *offsets, const int64_t *lengths, Py_ssize_t n,
                      const unsigned char *head, Py_ssize_t start, Py_ssize_t size, unsigned char *out,
                      int64_t *label_out, char *status, Py_ssize_t c, Py_ssize_t h, Py_ssize_t w, int reverse)
{
    Py_ssize_t end = start + size;
    const int stream = n * size >= STREAM_BYTES;
    for (Py_ssize_t j = 0; j < n; j++) {
        const unsigned char *value = base + offsets[j];
        Py_ssize_t len = (Py_ssize_t)lengths[j];
        int64_t label;
        if (len < end + 2 || memcmp(value, head, (size_t)start) != 0
            || tail_label(value + end, len - end, &label) < 0) {
            status[j] = 1;
            continue;
        }
        if (c == 1)
            memcpy(out + j * size, value + start, (size_t)size);  /* one plane is already interleaved */
        else
            record_u8_to(value + start, out + j * size, c, h, w, reverse, stream);
        label_out[j] = label;
    }
    end_of_batch(stream);
}

static int get_int64s(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t n)
{
    if (get_input(obj, view, what) < 0)
        return -1;
    char code = format_code(view);
    if (view->itemsize != 8 || !(code == 'q' || code == 'l') || (n >= 0 && view->len != n * 8)) {
        PyErr_Format(PyExc_ValueError, "%s must be int64%s, got %zd bytes of format '%s'", what,
                     n >= 0 ? " of the same length as offsets" : "", view->len, view->format ? view->format : "B");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(decode_raw_datums_at_doc,
"decode_raw_datums_at(map, offsets, lengths, header, dst, labels, channels, height, width, reverse=False) -> list\n--\n\n"
"As decode_raw_datums, for records lying in the one bytes-like `map` (e.g. a read-only mmap of\n"
"data.mdb): record j is map[offsets[j]:offsets[j] + lengths[j]] (int64 arrays).  Every record must\n"
"lie inside the map (ValueError otherwise, before anything is written).  Returns the positions j\n"
"laid out otherwise; their rows are left untouched.");

static PyObject *decode_raw_datums_at(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"map", "offsets", "lengths", "header", "dst", "labels", "channels", "height",
                               "width", "reverse", NULL};
    PyObject *map_obj, *offsets_obj, *lengths_obj, *dst_obj, *labels_obj;
    Py_buffer header;
    Py_ssize_t c, h, w;
    int reverse = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOy*OOnnn|p:decode_raw_datums_at", keywords, &map_obj,
                                     &offsets_obj, &lengths_obj, &header, &dst_obj, &labels_obj, &c, &h, &w,
                                     &reverse))
        return NULL;
    PyObject *result = NULL;
    Py_buffer map = {0}, offsets = {0}, lengths = {0}, dst = {0}, labels = {0};
    int have_map = 0, have_offsets = 0, have_lengths = 0, have_dst = 0, have_labels = 0;
    char *status = NULL;
    Py_ssize_t n = 0;

    if (check_dims(c, h, w) < 0)
        goto done;
    Py_ssize_t size = c * h * w;
    if (get_input(map_obj, &map, "map") < 0)
        goto done;
    have_map = 1;
    if (get_int64s(offsets_obj, &offsets, "offsets", -1) < 0)
        goto done;
    have_offsets = 1;
    n = offsets.len / 8;
    if (get_int64s(lengths_obj, &lengths, "lengths", n) < 0)
        goto done;
    have_lengths = 1;
    if (get_batch_outputs(dst_obj, &dst, &have_dst, labels_obj, &labels, &have_labels, n, c, h, w) < 0)
        goto done;
    if (overlaps(&map, &dst) || overlaps(&map, &labels)) {
        PyErr_SetString(PyExc_ValueError, "map must not overlap dst or labels");
        goto done;
    }
    const int64_t *off = offsets.buf, *len = lengths.buf;
    for (Py_ssize_t j = 0; j < n; j++) {
        if (off[j] < 0 || len[j] < 0 || off[j] > (int64_t)map.len || len[j] > (int64_t)map.len - off[j]) {
            PyErr_Format(PyExc_ValueError, "record %zd at offset %lld with %lld bytes lies outside the map of %zd bytes",
                         j, (long long)off[j], (long long)len[j], map.len);
            goto done;
        }
    }
    status = PyMem_Calloc(n ? n : 1, 1);
    if (status == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (n * size >= RELEASE_BYTES) {
        Py_BEGIN_ALLOW_THREADS
        decode_at(map.buf, off, len, n, header.buf, header.len, size, dst.buf, labels.buf, status, c, h, w, reverse);
        Py_END_ALLOW_THREADS
    } else {
        decode_at(map.buf, off, len, n, header.buf, header.len, size, dst.buf, labels.buf, status, c, h, w, reverse);
    }
    result = flagged_positions(status, n);
done:
    PyMem_Free(status);
    if (have_labels)
        PyBuffer_Release(&labels);
    if (have_dst)
        PyBuffer_Release(&dst);
    if (have_lengths)
        PyBuffer_Release(&lengths);
    if (have_offsets)
        PyBuffer_Release(&offsets);
    if (have_map)
        PyBuffer_Release(&map);
    PyBuffer_Release(&header);
    return result;
}

/* ---- gather ------------------------------------------------------------------------------------- */

PyDoc_STRVAR(gather_doc,
"gather(src, offsets, dst)\n--\n\n"
"Copy row j of `dst` (a writable C-contiguous array of N equal rows, N = len(offsets)) from the\n"
"bytes of `src` starting at offsets[j] (int64).  Every row must lie inside `src` (ValueError\n"
"otherwise, before anything is written).");

static PyObject *gather(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"src", "offsets", "dst", NULL};
    PyObject *src_obj, *offsets_obj, *dst_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO:gather", keywords, &src_obj, &offsets_obj, &dst_obj))
        return NULL;
    Py_buffer src, offsets, dst;
    if (get_input(src_obj, &src, "src") < 0)
        return NULL;
    if (get_int64s(offsets_obj, &offsets, "offsets", -1) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    if (get_output(dst_obj, &dst, "dst") < 0) {
        PyBuffer_Release(&offsets);
        PyBuffer_Release(&src);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t n = offsets.len / 8;
    const int64_t *off = offsets.buf;
    Py_ssize_t row = n ? dst.len / n : 0;
    if (n == 0 ? dst.len != 0 : dst.len % n != 0) {
        PyErr_Format(PyExc_ValueError, "dst holds %zd bytes, not %zd equal rows", dst.len, n);
        goto done;
    }
    if (overlaps(&src, &dst)) {
        PyErr_SetString(PyExc_ValueError, "src and dst overlap");
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        if (off[j] < 0 || off[j] > (int64_t)src.len || (int64_t)row > (int64_t)src.len - off[j]) {
            PyErr_Format(PyExc_ValueError, "row %zd at offset %lld with %zd bytes lies outside src of %zd bytes",
                         j, (long long)off[j], row, src.len);
            goto done;
        }
    }
    {
        const unsigned char *in = src.buf;
        unsigned char *out = dst.buf;
        PyThreadState *save = dst.len >= RELEASE_BYTES ? PyEval_SaveThread() : NULL;
        for (Py_ssize_t j = 0; j < n; j++)
            memcpy(out + j * row, in + off[j], (size_t)row);
        if (save != NULL)
            PyEval_RestoreThread(save);
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&src);
    return result;
}

/* ---- the module --------------------------------------------------------------------------------- */

static PyMethodDef methods[] = {
    {"interleave", (PyCFunction)(void (*)(void))interleave, METH_VARARGS | METH_KEYWORDS, interleave_doc},
    {"decode_raw_datums", (PyCFunction)(void (*)(void))decode_raw_datums, METH_VARARGS | METH_KEYWORDS,
     decode_raw_datums_doc},
    {"decode_raw_datums_at", (PyCFunction)(void (*)(void))decode_raw_datums_at, METH_VARARGS | METH_KEYWORDS,
     decode_raw_datums_at_doc},
    {"gather", (PyCFunction)(void (*)(void))gather, METH_VARARGS | METH_KEYWORDS, gather_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "firescale._pixels",
    .m_doc = "Caffe's planar (C, H, W) pixels interleaved into (H, W, C) rows, with the GIL released.",
    .m_size = 0,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__pixels(void)
{
#if HAVE_SSSE3_PATH
    __builtin_cpu_init();
#endif
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "RELEASE_BYTES", RELEASE_BYTES) < 0
                      || PyModule_AddIntConstant(m, "KERNEL_VERSION", KERNEL_VERSION) < 0))
        Py_CLEAR(m);
    return m;
}
