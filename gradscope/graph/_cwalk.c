/* The graph walk of gradscope.graph.walk, compiled.
 *
 * The Python walker (gradscope/graph/walk.py, `_Walker.walk`) is the reference; this module does
 * the same walk, in the same order, with the same results, for a fraction of the cost: the
 * interpreter overhead of the loop and of building one `Node` per autograd node and one `Edge`
 * per edge is most of what a walk costs in pure Python.
 *
 * Only the CPython C API is used (no torch headers): autograd nodes are reached through their
 * Python wrappers (`next_functions`, `variable`, ...), exactly as the Python walker reaches them.
 * `Node`, `Edge` and `TensorInfo` are slotted dataclasses; their instances are allocated here
 * and their slots filled directly, which gives the object `__init__` would have built (every
 * field is set; `attrs` and `saved` get a fresh dict and list, as their default factories do;
 * `Node`'s fields after `order` get the defaults `configure` was given).
 * `configure` checks the slot layout once, so a field added to a dataclass without updating
 * this file fails loudly at import rather than producing half-built objects.
 *
 * Saved tensors of built-in nodes are read here too, in the common case (a plain tensor held by
 * a `_raw_saved_*` handle, or a non-tensor attribute); everything rarer (saved lists, tensors
 * packed by saved_tensors_hooks, freed tensors, custom Functions, module paths, a storage seen
 * for the first time) is handed back to the `_Walker` methods that the Python walk uses.
 *
 * Everything Python this file uses is given to it: the classes and helpers once, to
 * `configure`; a walk's containers and the `_Walker` methods it falls back to, as the
 * arguments of `walk`. It looks up no name of gradscope's itself (only torch's public
 * attributes of the tensors and autograd nodes it reads, as the Python walker reads them).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_FIELDS 24

/* A slotted dataclass: its type, the offsets of its slots in field order, and for the fields
 * past the ones this file fills (`n_fixed`), their defaults (immutable values: None, False...),
 * so that a field added at the end of `Node` needs no change here. */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t n;
    Py_ssize_t n_fixed;
    PyObject *defaults; /* tuple of n - n_fixed values, or NULL when n == n_fixed */
    Py_ssize_t off[MAX_FIELDS];
    /* the distinct default values and how many slots take each (None 7 times, False twice):
     * a new instance takes their references in one step each */
    PyObject *dobj[MAX_FIELDS];
    Py_ssize_t dcount[MAX_FIELDS], n_dobj;
} Layout;

enum { N_ID, N_NAME, N_KIND, N_MODULE, N_ATTRS, N_SAVED, N_TENSOR, N_ORDER, N_FIELDS };
enum { E_SRC, E_DST, E_INPUT_NR, E_KIND, E_GRAD_NORM, E_COUNT, E_FIELDS };
enum { T_NAME, T_SHAPE, T_DTYPE, T_DEVICE, T_STORAGE, T_FIELDS };
enum { S_NAME, S_SHAPE, S_DTYPE, S_DEVICE, S_NBYTES, S_STORAGE, S_FREED, S_STORAGE_NBYTES,
       S_ALIAS, S_FIELDS };

static Layout NODE, EDGE, TINFO, SAVED;
static int configured = 0;

/* type -> (name, kind, is_accumulate, is_custom, reads, unpacked), from class_entry_fn */
static PyObject *class_cache;
/* the classes looked up last and their entries (borrowed: class_cache holds both until
 * configure replaces it): a graph repeats a few classes (a Linear + ReLU layer has four), and a
 * scan of a few pointers is cheaper than a dict lookup */
#define RECENT_CLASSES 8
static PyObject *recent_cls[RECENT_CLASSES], *recent_entry[RECENT_CLASSES];
static int recent_next;
static PyObject *class_entry_fn; /* gradscope.graph.walk._class_entry */
static PyObject *dtype_names;   /* dtype -> "float32" (shared with the Python walker) */
static PyObject *dtype_name_fn; /* gradscope.graph.walk._dtype_name */
static PyObject *last_dtype, *last_dtype_name; /* the last dtype named, and its name (owned) */
static PyObject *tensor_type;   /* torch.Tensor */
static PyObject *storage_key_fn; /* tensor -> its StorageImpl's address (_Storages' key) */

static PyObject *s_cpu, *s_grad, *s_leaf, *s_empty;
static PyObject *s_next_functions, *s_variable, *s_shape, *s_dtype, *s_is_cpu, *s_device;
static PyObject *s_data, *s_nbytes, *s_untyped_storage;
static PyObject *i_one, *i_zero;

static int
layout_init(Layout *L, PyObject *type, PyObject *names, Py_ssize_t expected, PyObject *defaults)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure: expected a class");
        return -1;
    }
    PyObject *seq = PySequence_Fast(names, "configure: field names must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t n_defaults = defaults == NULL ? 0 : PyTuple_GET_SIZE(defaults);
    if (n != expected + n_defaults || n > MAX_FIELDS) {
        PyErr_Format(PyExc_RuntimeError,
                     "gradscope.graph._cwalk: %s has %zd fields, this build fills %zd and has %zd "
                     "defaults; update gradscope/graph/_cwalk.c",
                     ((PyTypeObject *)type)->tp_name, n, expected, n_defaults);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyObject_GetAttr(type, PySequence_Fast_GET_ITEM(seq, i));
        if (d == NULL) {
            Py_DECREF(seq);
            return -1;
        }
        if (!Py_IS_TYPE(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_RuntimeError,
                         "gradscope.graph._cwalk: field %R of %s is not a __slots__ member",
                         PySequence_Fast_GET_ITEM(seq, i), ((PyTypeObject *)type)->tp_name);
            Py_DECREF(d);
            Py_DECREF(seq);
            return -1;
        }
        L->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    Py_DECREF(seq);
    /* `new_instance` allocates without zeroing and fills the slots only: they must be all the
     * object holds (no __dict__, no __weakref__, nothing else), each filled once */
    PyTypeObject *tp = (PyTypeObject *)type;
    int whole = tp->tp_basicsize == (Py_ssize_t)(sizeof(PyObject) + n * sizeof(PyObject *))
                && tp->tp_itemsize == 0 && tp->tp_dictoffset == 0 && tp->tp_weaklistoffset == 0
                && tp->tp_alloc == PyType_GenericAlloc && PyType_IS_GC(tp);
    for (Py_ssize_t i = 0; whole && i < n; i++)
        for (Py_ssize_t j = 0; j < i; j++)
            whole = whole && L->off[i] != L->off[j];
    if (!whole) {
        PyErr_Format(PyExc_RuntimeError,
                     "gradscope.graph._cwalk: %s holds more than its fields' slots; update "
                     "gradscope/graph/_cwalk.c", tp->tp_name);
        return -1;
    }
    L->type = (PyTypeObject *)Py_NewRef(type);
    L->n = n;
    L->n_fixed = expected;
    L->defaults = n_defaults ? Py_NewRef(defaults) : NULL;
    L->n_dobj = 0;
    for (Py_ssize_t i = 0; i < n_defaults; i++) {
        PyObject *d = PyTuple_GET_ITEM(defaults, i);
        Py_ssize_t k = 0;
        while (k < L->n_dobj && L->dobj[k] != d)
            k++;
        if (k == L->n_dobj) {
            L->dobj[k] = d; /* borrowed: L->defaults holds it */
            L->dcount[k] = 0;
            L->n_dobj++;
        }
        L->dcount[k]++;
    }
    return 0;
}

static void
layout_clear(Layout *L)
{
    Py_XDECREF(L->type);
    Py_XDECREF(L->defaults);
    L->type = NULL;
    L->defaults = NULL;
}

/* A new instance with every slot set to vals[i] (borrowed references; new ones are taken).
 * The object is allocated as `tp_alloc` would, without zeroing memory that every slot then
 * overwrites (the classes are slots-only: `configure` checks that the slots are all there is),
 * and tracked by the collector once it is whole. */
static PyObject *
new_instance(Layout *L, PyObject **vals)
{
    PyObject *obj = PyObject_GC_New(PyObject, L->type);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < L->n_fixed; i++)
        *(PyObject **)((char *)obj + L->off[i]) = Py_NewRef(vals[i]);
    for (Py_ssize_t i = L->n_fixed; i < L->n; i++)
        *(PyObject **)((char *)obj + L->off[i]) = PyTuple_GET_ITEM(L->defaults, i - L->n_fixed);
    for (Py_ssize_t k = 0; k < L->n_dobj; k++) /* the references those slots hold */
        for (Py_ssize_t j = 0; j < L->dcount[k]; j++)
            Py_INCREF(L->dobj[k]);
    PyObject_GC_Track(obj);
    return obj;
}

static PyObject *
new_node(PyObject *nid, PyObject *name, PyObject *kind, PyObject *tensor)
{
    PyObject *attrs = PyDict_New();
    PyObject *saved = PyList_New(0);
    if (attrs == NULL || saved == NULL) {
        Py_XDECREF(attrs);
        Py_XDECREF(saved);
        return NULL;
    }
    PyObject *vals[N_FIELDS] = {nid, name, kind, Py_None, attrs, saved, tensor, Py_None};
    PyObject *node = new_instance(&NODE, vals);
    Py_DECREF(attrs);
    Py_DECREF(saved);
    return node;
}

/* A grad Edge; `dst` may still be an autograd node, which `make_edges` replaces by its id. */
static PyObject *
new_edge(PyObject *src, PyObject *dst, PyObject *input_nr)
{
    PyObject *vals[E_FIELDS] = {src, dst, input_nr, s_grad, Py_None, i_one};
    return new_instance(&EDGE, vals);
}

/* Tensor attributes read for every leaf and saved tensor (`shape`, `dtype`, `is_cpu`): for a
 * tensor of a class that resolves them to torch's own getset descriptors (torch.Tensor,
 * nn.Parameter) and uses the generic attribute lookup, the descriptor's getter is called
 * directly: what `PyObject_GetAttr` does for a data descriptor, less the lookup (most of what
 * reading one costs). Any other class (a subclass overriding one, `__getattr__`...) takes
 * `PyObject_GetAttr`. Classes are checked once and kept with their version tag, which CPython
 * changes when a class (or a base) is modified, so a later override is seen. */
enum { A_SHAPE, A_DTYPE, A_IS_CPU, A_COUNT };
static PyObject *t_descr[A_COUNT]; /* torch's getset descriptors, or NULL */
#define PLAIN_TYPES 4
static struct {
    PyTypeObject *type; /* owned */
    unsigned int tag;
    int plain;
} plain_types[PLAIN_TYPES];
static int plain_next;

static void
plain_types_clear(void)
{
    for (int i = 0; i < PLAIN_TYPES; i++)
        Py_CLEAR(plain_types[i].type);
    plain_next = 0;
}

static PyObject *
attr_name(int which)
{
    return which == A_SHAPE ? s_shape : which == A_DTYPE ? s_dtype : s_is_cpu;
}

static int
plain_tensor_type(PyTypeObject *tp)
{
    for (int i = 0; i < PLAIN_TYPES; i++)
        if (plain_types[i].type == tp) {
            if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)
                && tp->tp_version_tag == plain_types[i].tag)
                return plain_types[i].plain;
            break;
        }
    int plain = tp->tp_getattro == PyObject_GenericGetAttr;
    for (int w = 0; plain && w < A_COUNT; w++)
        plain = t_descr[w] != NULL && _PyType_Lookup(tp, attr_name(w)) == t_descr[w]
                && PyType_IsSubtype(tp, PyDescr_TYPE(t_descr[w]));
    if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) {
        int i = 0;
        while (i < PLAIN_TYPES && plain_types[i].type != tp)
            i++;
        if (i == PLAIN_TYPES) {
            i = plain_next;
            plain_next = (plain_next + 1) % PLAIN_TYPES;
        }
        Py_XSETREF(plain_types[i].type, (PyTypeObject *)Py_NewRef(tp));
        plain_types[i].tag = tp->tp_version_tag;
        plain_types[i].plain = plain;
    }
    return plain;
}

/* `getattr(fn, name)` for an autograd node (`next_functions`, `variable`, `_saved_*`): when
 * its class takes the generic attribute lookup and `name` resolves to a getset descriptor (a
 * data descriptor, which that lookup calls before anything else), its getter is called
 * directly, as the lookup would call it; anything else takes `PyObject_GetAttr`. */
static PyObject *
node_attr(PyObject *fn, PyObject *name)
{
    PyTypeObject *tp = Py_TYPE(fn);
    if (tp->tp_getattro == PyObject_GenericGetAttr) {
        PyObject *d = _PyType_Lookup(tp, name); /* borrowed */
        if (d != NULL && Py_IS_TYPE(d, &PyGetSetDescr_Type)
            && ((PyGetSetDescrObject *)d)->d_getset->get != NULL) {
            PyGetSetDef *gs = ((PyGetSetDescrObject *)d)->d_getset;
            Py_INCREF(d); /* as the lookup holds it: the getter could change the class */
            PyObject *out = gs->get(fn, gs->closure);
            Py_DECREF(d);
            return out;
        }
    }
    return PyObject_GetAttr(fn, name);
}

static PyObject *
tensor_attr(PyObject *t, int which)
{
    if (!plain_tensor_type(Py_TYPE(t)))
        return PyObject_GetAttr(t, attr_name(which));
    PyGetSetDef *gs = ((PyGetSetDescrObject *)t_descr[which])->d_getset;
    return gs->get(t, gs->closure);
}

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *node_t, *node_f, *node_d, *edge_t, *edge_f, *ti_t, *ti_f, *saved_t, *saved_f;
    PyObject *entry_fn, *dnames, *dname_fn, *tensor_t, *key_fn;
    if (!PyArg_ParseTuple(args, "OOO!OOOOOOOO!OOO", &node_t, &node_f, &PyTuple_Type, &node_d,
                          &edge_t, &edge_f, &ti_t, &ti_f, &saved_t, &saved_f, &entry_fn,
                          &PyDict_Type, &dnames, &dname_fn, &tensor_t, &key_fn))
        return NULL;
    /* all or nothing: a rejected layout leaves the previous configuration in place */
    Layout node = {NULL, 0, 0, NULL, {0}}, edge = {NULL, 0, 0, NULL, {0}};
    Layout tinfo = {NULL, 0, 0, NULL, {0}}, saved = {NULL, 0, 0, NULL, {0}};
    if (layout_init(&node, node_t, node_f, N_FIELDS, node_d) < 0
        || layout_init(&edge, edge_t, edge_f, E_FIELDS, NULL) < 0
        || layout_init(&tinfo, ti_t, ti_f, T_FIELDS, NULL) < 0
        || layout_init(&saved, saved_t, saved_f, S_FIELDS, NULL) < 0) {
        layout_clear(&node);
        layout_clear(&edge);
        layout_clear(&tinfo);
        layout_clear(&saved);
        return NULL;
    }
    PyObject *cache = PyDict_New();
    if (cache == NULL)
        return NULL;
    layout_clear(&NODE);
    layout_clear(&EDGE);
    layout_clear(&TINFO);
    layout_clear(&SAVED);
    NODE = node;
    EDGE = edge;
    TINFO = tinfo;
    SAVED = saved;
    Py_XSETREF(class_entry_fn, Py_NewRef(entry_fn));
    Py_XSETREF(dtype_names, Py_NewRef(dnames));
    Py_XSETREF(dtype_name_fn, Py_NewRef(dname_fn));
    Py_XSETREF(tensor_type, Py_NewRef(tensor_t));
    plain_types_clear();
    for (int w = 0; w < A_COUNT; w++) {
        PyObject *d = PyType_Check(tensor_t)
                          ? _PyType_Lookup((PyTypeObject *)tensor_t, attr_name(w)) : NULL;
        Py_XSETREF(t_descr[w], d != NULL && Py_IS_TYPE(d, &PyGetSetDescr_Type)
                                   && ((PyGetSetDescrObject *)d)->d_getset->get != NULL
                                   ? Py_NewRef(d) : NULL);
    }
    Py_XSETREF(storage_key_fn, Py_NewRef(key_fn));
    for (int i = 0; i < RECENT_CLASSES; i++) /* borrowed from the cache dropped here */
        recent_cls[i] = recent_entry[i] = NULL;
    Py_CLEAR(last_dtype);
    Py_CLEAR(last_dtype_name);
    Py_XSETREF(class_cache, cache);
    configured = 1;
    Py_RETURN_NONE;
}

/* (name, kind, is_accumulate, is_custom, reads, unpacked) for the class of an autograd node,
 * as `class_entry_fn` gives it (checked once, then cached); borrowed. `reads` is
 * `_ClassInfo.reads`: (name, attribute, is a tensor) per saved field; `unpacked` its
 * `_saved_<name>` attribute names. */
static PyObject *
class_entry(PyObject *cls)
{
    for (int i = 0; i < RECENT_CLASSES; i++)
        if (recent_cls[i] == cls)
            return recent_entry[i];
    PyObject *entry = PyDict_GetItemWithError(class_cache, cls);
    if (entry != NULL) {
        recent_cls[recent_next] = cls;
        recent_entry[recent_next] = entry;
        recent_next = (recent_next + 1) % RECENT_CLASSES;
    }
    if (entry != NULL || PyErr_Occurred())
        return entry;
    entry = PyObject_CallOneArg(class_entry_fn, cls);
    if (entry == NULL)
        return NULL;
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 6
        || !PyBool_Check(PyTuple_GET_ITEM(entry, 2)) || !PyBool_Check(PyTuple_GET_ITEM(entry, 3))
        || !PyTuple_Check(PyTuple_GET_ITEM(entry, 4)) || !PyTuple_Check(PyTuple_GET_ITEM(entry, 5))
        || PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 4))
               != PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 5))) {
        PyErr_SetString(PyExc_TypeError,
                        "class_entry must return (name, kind, is_accumulate, is_custom, reads, "
                        "unpacked), reads and unpacked tuples of one length");
        Py_DECREF(entry);
        return NULL;
    }
    int err = PyDict_SetItem(class_cache, cls, entry);
    Py_DECREF(entry); /* the cache holds it */
    return err < 0 ? NULL : entry;
}

static int
append_steal(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int err = PyList_Append(list, item);
    Py_DECREF(item);
    return err;
}

/* "n<len(nodes)>", the next node id, and "s<k>", a storage id (PyUnicode_FromFormat's printf
 * was a third of a walk). The first ID_CACHE ids of each kind are made once and shared by
 * every graph (strings are immutable, and an id is only ever compared by value): a walk of a
 * graph of that size makes no id string, and their hashes are already computed for the dicts
 * the views build from them (ID_CACHE strings of 56 bytes: under 1 MiB a kind, held once a
 * graph that big was walked). */
#define ID_CACHE 16384
static PyObject *node_id_texts[ID_CACHE], *storage_id_texts[ID_CACHE];

static PyObject *
small_id(char prefix, size_t v, PyObject **cache)
{
    if (v < ID_CACHE && cache[v] != NULL)
        return Py_NewRef(cache[v]);
    char buf[32];
    char *p = buf + sizeof(buf);
    size_t rest = v;
    do {
        *--p = (char)('0' + rest % 10);
        rest /= 10;
    } while (rest);
    *--p = prefix;
    Py_ssize_t len = buf + sizeof(buf) - p;
    PyObject *s = PyUnicode_New(len, 127); /* ASCII: no UTF-8 decoding */
    if (s == NULL)
        return NULL;
    memcpy(PyUnicode_1BYTE_DATA(s), p, len);
    if (v < ID_CACHE) {
        (void)PyObject_Hash(s); /* cached in the string */
        cache[v] = Py_NewRef(s);
    }
    return s;
}

static PyObject *
node_id(PyObject *nodes)
{
    return small_id('n', (size_t)PyList_GET_SIZE(nodes), node_id_texts);
}

/* What one walk works on: the `_Walker`'s containers and the methods it falls back to, all
 * given as the arguments of `walk` (borrowed: the call's arguments hold them). */
typedef struct {
    PyObject *nodes, *ids, *raw_edges, *names; /* list, dict, list, dict */
    PyObject *storage_ids;                     /* _Storages.by_key: key -> (sid, size) */
    int want_saved, read_modules;
    PyObject *record_of, *visit_modules, *custom_saved, *read_saved, *read_saved_seq, *record;
    PyObject *shape_of;
    PyObject *texts; /* str() of the attribute values `cached_str` keeps, for one walk */
} Ctx;

static int
call_drop(PyObject *callable, PyObject *a, PyObject *b, PyObject *c, PyObject *d, PyObject *e)
{
    PyObject *r = PyObject_CallFunctionObjArgs(callable, a, b, c, d, e, NULL);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* `_Storages.record_of(t)`: a (storage id, storage bytes) tuple as a new reference, (None, None)
 * for a storage-less tensor; same key, numbering and record as the Python method, in one dict
 * operation when the storage was seen before. */
static PyObject *
storage_record(Ctx *c, PyObject *t)
{
    PyObject *key = PyObject_CallOneArg(storage_key_fn, t);
    if (key == NULL) {
        /* a storage-less tensor (sparse, nested...): the Python method decides */
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError)
            && !PyErr_ExceptionMatches(PyExc_AttributeError))
            return NULL;
        PyErr_Clear();
        PyObject *rec = PyObject_CallOneArg(c->record_of, t);
        if (rec != NULL && (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 2)) {
            PyErr_SetString(PyExc_TypeError, "record_of must return a (sid, size) pair");
            Py_CLEAR(rec);
        }
        return rec;
    }
    PyObject *rec = PyDict_GetItemWithError(c->storage_ids, key);
    if (rec != NULL || PyErr_Occurred()) {
        Py_DECREF(key);
        return Py_XNewRef(rec);
    }
    /* first sight: ("s<count>", the storage's size) */
    PyObject *sid = NULL, *size = NULL, *st = PyObject_CallMethodNoArgs(t, s_untyped_storage);
    if (st != NULL) {
        size = PyObject_CallMethodNoArgs(st, s_nbytes);
        Py_DECREF(st);
    }
    if (size != NULL
        && (sid = small_id('s', (size_t)PyDict_GET_SIZE(c->storage_ids), storage_id_texts)) != NULL
        && (rec = PyTuple_Pack(2, sid, size)) != NULL
        && PyDict_SetItem(c->storage_ids, key, rec) < 0)
        Py_CLEAR(rec);
    Py_DECREF(key);
    Py_XDECREF(sid);
    Py_XDECREF(size);
    return rec;
}

static PyObject *
dtype_str(PyObject *t)
{
    PyObject *dtype = tensor_attr(t, A_DTYPE);
    if (dtype == NULL)
        return NULL;
    if (dtype == last_dtype) { /* a model's tensors mostly share one dtype */
        Py_DECREF(dtype);
        return Py_NewRef(last_dtype_name);
    }
    PyObject *name = PyDict_GetItemWithError(dtype_names, dtype);
    if (name != NULL)
        Py_INCREF(name);
    else if (!PyErr_Occurred())
        name = PyObject_CallOneArg(dtype_name_fn, dtype);
    if (name != NULL && PyUnicode_CheckExact(name)) {
        Py_XSETREF(last_dtype_name, Py_NewRef(name));
        Py_XSETREF(last_dtype, Py_NewRef(dtype));
    }
    Py_DECREF(dtype);
    return name;
}

static PyObject *
device_str(PyObject *t)
{
    PyObject *is_cpu = tensor_attr(t, A_IS_CPU);
    if (is_cpu == NULL)
        return NULL;
    int cpu = is_cpu == Py_True;
    Py_DECREF(is_cpu);
    if (cpu)
        return Py_NewRef(s_cpu);
    PyObject *dev = PyObject_GetAttr(t, s_device);
    if (dev == NULL)
        return NULL;
    PyObject *out = PyObject_Str(dev);
    Py_DECREF(dev);
    return out;
}

/* `list(t.shape)`; when that is not a list of ints (a nested tensor: a strided one has no
 * shape, a jagged one has a symbolic ragged size), `_Walker.shape_of` decides (None for a
 * ragged dimension). */
static PyObject *
shape_list(Ctx *c, PyObject *t)
{
    PyObject *shape = tensor_attr(t, A_SHAPE);
    if (shape == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
            return NULL;
        PyErr_Clear();
        return PyObject_CallOneArg(c->shape_of, t);
    }
    PyObject *out;
    if (PyTuple_Check(shape)) { /* torch.Size: copied item by item (list() of a tuple
                                 * subclass goes through its iterator, 3x slower) */
        Py_ssize_t n = PyTuple_GET_SIZE(shape);
        out = PyList_New(n);
        for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
            PyObject *d = PyTuple_GET_ITEM(shape, i);
            if (!PyLong_CheckExact(d)) {
                Py_DECREF(out);
                Py_DECREF(shape);
                return PyObject_CallOneArg(c->shape_of, t);
            }
            PyList_SET_ITEM(out, i, Py_NewRef(d));
        }
        Py_DECREF(shape);
        return out;
    }
    out = PySequence_List(shape);
    Py_DECREF(shape);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(out); i++) {
        if (!PyLong_CheckExact(PyList_GET_ITEM(out, i))) {
            Py_DECREF(out);
            return PyObject_CallOneArg(c->shape_of, t);
        }
    }
    return out;
}

/* `str(v)`, kept for the walk when `v` is an int or a tuple of ints (the `_sym_sizes` and
 * `_sym_strides` of every Linear: the same few values thousands of times, and formatting a
 * tuple is most of what reading an attribute costs). Only exact ints and tuples of exact
 * ints are kept: equal ones have the same text (an int never equals a tuple; a bool, a float
 * or an int subclass, which could equal an int but print otherwise, is never kept). */
static PyObject *
cached_str(Ctx *c, PyObject *v)
{
    int keep = PyLong_CheckExact(v);
    if (!keep && PyTuple_CheckExact(v) && PyTuple_GET_SIZE(v) <= 16) {
        keep = 1;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
            if (!PyLong_CheckExact(PyTuple_GET_ITEM(v, i))) {
                keep = 0;
                break;
            }
        }
    }
    if (!keep)
        return PyObject_Str(v);
    PyObject *text = PyDict_GetItemWithError(c->texts, v);
    if (text != NULL)
        return Py_NewRef(text);
    if (PyErr_Occurred() || (text = PyObject_Str(v)) == NULL)
        return NULL;
    if (PyDict_SetItem(c->texts, v, text) < 0)
        Py_CLEAR(text);
    return text;
}

/* `_Walker.saved_record(name, t)`: a SavedTensor for a tensor still held by the graph. The
 * dataclass's __post_init__ (storage_nbytes defaults to nbytes) is applied here; `alias` is
 * None (the walk marks the storages of a model's parameters, buffers and inputs afterwards). */
static PyObject *
saved_record(Ctx *c, PyObject *name, PyObject *t)
{
    PyObject *out = NULL, *shape = NULL, *dtype = NULL, *device = NULL, *nbytes = NULL;
    PyObject *rec = storage_record(c, t);
    if (rec == NULL || (shape = shape_list(c, t)) == NULL || (dtype = dtype_str(t)) == NULL
        || (device = device_str(t)) == NULL || (nbytes = PyObject_GetAttr(t, s_nbytes)) == NULL)
        goto done;
    PyObject *size = PyTuple_GET_ITEM(rec, 1);
    PyObject *vals[S_FIELDS] = {name, shape, dtype, device, nbytes, PyTuple_GET_ITEM(rec, 0),
                                Py_False, size != Py_None ? size : nbytes, Py_None};
    out = new_instance(&SAVED, vals);
done:
    if (out == NULL && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
        /* e.g. a sparse tensor's nbytes: `_Walker.saved_record` knows the unusual tensors */
        PyErr_Clear();
        out = PyObject_CallFunctionObjArgs(c->record, name, t, NULL);
    }
    Py_XDECREF(rec);
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    Py_XDECREF(nbytes);
    return out;
}

/* A saved-tensor handle with no data: an optional tensor that was never saved (the unpacked
 * value, usually None, becomes an attribute, as `read_saved` does), or one that backward freed
 * (unpacking raises; `read_saved` records it as freed). */
static int
not_saved(Ctx *c, PyObject *fn, PyObject *name, PyObject *unpacked_attr, PyObject *raw,
          PyObject *node, PyObject *attrs)
{
    PyObject *val = node_attr(fn, unpacked_attr);
    if (val == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_RuntimeError))
            return -1;
        PyErr_Clear();
        return call_drop(c->read_saved, fn, name, Py_None, raw, node);
    }
    PyObject *text = PyObject_Str(val);
    Py_DECREF(val);
    int err = text == NULL ? -1 : PyDict_SetItem(attrs, name, text);
    Py_XDECREF(text);
    return err;
}

/* `_Walker.builtin_saved`: every `_saved_*` field of a built-in node, in `reads` order. */
static int
builtin_saved(Ctx *c, PyObject *fn, PyObject *node, PyObject *reads, PyObject *unpacked)
{
    PyObject *attrs = *(PyObject **)((char *)node + NODE.off[N_ATTRS]);
    PyObject *saved = *(PyObject **)((char *)node + NODE.off[N_SAVED]);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(reads); i++) {
        PyObject *r = PyTuple_GET_ITEM(reads, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 3) {
            PyErr_SetString(PyExc_TypeError, "_ClassInfo.reads items must be 3-tuples");
            return -1;
        }
        PyObject *name = PyTuple_GET_ITEM(r, 0), *attr = PyTuple_GET_ITEM(r, 1);
        PyObject *raw = node_attr(fn, attr);
        if (raw == NULL) {
            /* a saved list (`indices` of x[idx], index_put...) that backward freed: torch
             * raises instead of handing out its entries; `read_saved_seq(..., None, ...)`
             * records it as freed, as the Python walk does */
            if (PyTuple_GET_ITEM(r, 2) != Py_True
                || !PyErr_ExceptionMatches(PyExc_RuntimeError))
                return -1;
            PyErr_Clear();
            if (call_drop(c->read_saved_seq, fn, name, Py_None, node, NULL) < 0)
                return -1;
            continue;
        }
        int err;
        if (PyTuple_GET_ITEM(r, 2) != Py_True) { /* a non-tensor attribute */
            PyObject *text = cached_str(c, raw);
            err = text == NULL ? -1 : PyDict_SetItem(attrs, name, text);
            Py_XDECREF(text);
        }
        else if (PyList_Check(raw) || PyTuple_Check(raw)) {
            err = call_drop(c->read_saved_seq, fn, name, raw, node, NULL);
        }
        else {
            PyObject *data = PyObject_GetAttr(raw, s_data);
            int is_tensor = data == NULL ? -1 : PyObject_IsInstance(data, tensor_type);
            if (is_tensor < 0)
                err = -1;
            else if (is_tensor)
                err = append_steal(saved, saved_record(c, name, data));
            else if (data == Py_None)
                err = not_saved(c, fn, name, PyTuple_GET_ITEM(unpacked, i), raw, node, attrs);
            else /* packed by a saved_tensors_hooks pack hook */
                err = call_drop(c->read_saved, fn, name, Py_None, raw, node);
            Py_XDECREF(data);
        }
        Py_DECREF(raw);
        if (err < 0)
            return -1;
    }
    return 0;
}

/* The `leaf` node of an AccumulateGrad (`_Walker.add_leaf`): the variable's name, shape,
 * dtype, device and (with saved tensors) storage id. */
static int
add_leaf(Ctx *c, PyObject *acc_id, PyObject *fn)
{
    int ret = -1;
    PyObject *var = NULL, *lid = NULL, *key = NULL, *shape = NULL, *dname = NULL;
    PyObject *device = NULL, *sid = NULL, *tinfo = NULL;

    if ((var = node_attr(fn, s_variable)) == NULL || (lid = node_id(c->nodes)) == NULL)
        goto done;
    PyObject *name = NULL; /* borrowed */
    if (PyDict_GET_SIZE(c->names) > 0) {
        if ((key = PyLong_FromVoidPtr(var)) == NULL)
            goto done;
        if ((name = PyDict_GetItemWithError(c->names, key)) == NULL && PyErr_Occurred())
            goto done;
    }
    if (name == NULL)
        name = s_empty;
    int truthy = PyObject_IsTrue(name);
    if (truthy < 0)
        goto done;
    if ((shape = shape_list(c, var)) == NULL || (dname = dtype_str(var)) == NULL
        || (device = device_str(var)) == NULL)
        goto done;
    if (c->want_saved) {
        PyObject *rec = storage_record(c, var);
        if (rec == NULL)
            goto done;
        sid = Py_NewRef(PyTuple_GET_ITEM(rec, 0));
        Py_DECREF(rec);
    }
    else
        sid = Py_NewRef(Py_None);
    PyObject *tvals[T_FIELDS] = {truthy ? name : Py_None, shape, dname, device, sid};
    if ((tinfo = new_instance(&TINFO, tvals)) == NULL)
        goto done;
    if (append_steal(c->nodes, new_node(lid, name, s_leaf, tinfo)) < 0)
        goto done;
    ret = append_steal(c->raw_edges, new_edge(acc_id, lid, i_zero));
done:
    Py_XDECREF(var);
    Py_XDECREF(lid);
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(dname);
    Py_XDECREF(device);
    Py_XDECREF(sid);
    Py_XDECREF(tinfo);
    return ret;
}

/* The walk's stack: an autograd node still to visit, and the Edge that leads to it (NULL for
 * the start), whose dst is set to the node's id when it is popped. */
typedef struct {
    PyObject *fn, *edge; /* owned references */
} Entry;

typedef struct {
    Entry *items;
    Py_ssize_t size, cap;
} Stack;

static int
stack_push(Stack *s, PyObject *fn, PyObject *edge)
{
    if (s->size == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 256;
        Entry *items = PyMem_Realloc(s->items, cap * sizeof(Entry));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->size].fn = Py_NewRef(fn);
    s->items[s->size].edge = Py_XNewRef(edge);
    s->size++;
    return 0;
}

static void
stack_clear(Stack *s)
{
    while (s->size > 0) {
        s->size--;
        Py_DECREF(s->items[s->size].fn);
        Py_XDECREF(s->items[s->size].edge);
    }
    PyMem_Free(s->items);
}

/* One node: give it its id, build its Node (saved tensors, leaf), record its edges, push its
 * inputs. The order of the reads is the Python walk's: module path, saved tensors, leaf. */
static int
visit_node(Ctx *c, PyObject *fn, PyObject *nid, Stack *stack)
{
    int ret = -1;
    PyObject *node = NULL, *nf = NULL, *k_obj = NULL, *entry = NULL;
    /* held for the whole visit: the Python callbacks below could (in principle) reconfigure */
    entry = Py_XNewRef(class_entry((PyObject *)Py_TYPE(fn)));
    if (entry == NULL)
        goto done;
    node = new_node(nid, PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1), Py_None);
    if (node == NULL || PyList_Append(c->nodes, node) < 0)
        goto done;
    if (c->read_modules && call_drop(c->visit_modules, fn, node, NULL, NULL, NULL) < 0)
        goto done;
    if (c->want_saved) {
        if (PyTuple_GET_ITEM(entry, 3) == Py_True) {
            if (call_drop(c->custom_saved, fn, node, NULL, NULL, NULL) < 0)
                goto done;
        }
        else if (builtin_saved(c, fn, node, PyTuple_GET_ITEM(entry, 4),
                               PyTuple_GET_ITEM(entry, 5)) < 0)
            goto done;
    }
    if (PyTuple_GET_ITEM(entry, 2) == Py_True && add_leaf(c, nid, fn) < 0)
        goto done;
    if ((nf = node_attr(fn, s_next_functions)) == NULL)
        goto done;
    if (!PyTuple_Check(nf)) {
        PyErr_Format(PyExc_TypeError, "next_functions of %R is not a tuple", fn);
        goto done;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(nf), first = PyList_GET_SIZE(c->raw_edges);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *pair = PyTuple_GET_ITEM(nf, k);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) < 1) {
            PyErr_Format(PyExc_TypeError, "next_functions[%zd] of %R is not a pair", k, fn);
            goto done;
        }
        PyObject *nxt = PyTuple_GET_ITEM(pair, 0);
        if (nxt == Py_None)
            continue;
        if ((k_obj = PyLong_FromSsize_t(k)) == NULL
            || append_steal(c->raw_edges, new_edge(nid, nxt, k_obj)) < 0)
            goto done;
        Py_CLEAR(k_obj);
    }
    /* every input is pushed with its edge, visited or not: a visited one is skipped when
     * popped, which visits the others in the same order as checking first, and then each
     * edge gets its dst id at the pop, with no dict lookup of its own (on a big graph each
     * lookup is a cache miss). The edges just appended hold the inputs as their dst. */
    for (Py_ssize_t j = PyList_GET_SIZE(c->raw_edges) - 1; j >= first; j--) {
        PyObject *edge = PyList_GET_ITEM(c->raw_edges, j);
        if (stack_push(stack, *(PyObject **)((char *)edge + EDGE.off[E_DST]), edge) < 0)
            goto done;
    }
    ret = 0;
done:
    Py_XDECREF(node);
    Py_XDECREF(nf);
    Py_XDECREF(k_obj);
    Py_XDECREF(entry);
    return ret;
}

PyDoc_STRVAR(walk_doc,
"walk(start, nodes, ids, raw_edges, names, storage_ids, want_saved, read_modules, record_of,\n"
"     visit_modules, custom_saved, read_saved, read_saved_seq, saved_record, shape_of)\n\n"
"Depth-first preorder from the autograd node `start`, exactly as `_Walker.walk_py` does: a\n"
"Node per new autograd node (and a leaf Node after each AccumulateGrad) appended to `nodes`,\n"
"each node object's id in `ids`, and one Edge per edge in `raw_edges`, its dst the id of the\n"
"node it leads to. `names`: id(tensor) -> parameter name, for leaves. `storage_ids`: the\n"
"storage key -> (sid, bytes) dict of `_Storages`, read and filled here; `record_of` its method\n"
"for the tensors without a key. With `want_saved`, saved tensors and attributes are read as\n"
"`builtin_saved` reads them; the `_Walker` methods given handle custom Functions\n"
"(`custom_saved`), module paths (`visit_modules`, with `read_modules`) and the rare cases\n"
"(`read_saved`, `read_saved_seq`, `saved_record`, `shape_of`).");

static PyObject *
walk(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"start", "nodes", "ids", "raw_edges", "names", "storage_ids",
                             "want_saved", "read_modules", "record_of", "visit_modules",
                             "custom_saved", "read_saved", "read_saved_seq", "saved_record",
                             "shape_of", NULL};
    PyObject *start;
    Ctx c;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs, "OO!O!O!O!O!ppOOOOOOO:walk", kwlist, &start, &PyList_Type, &c.nodes,
            &PyDict_Type, &c.ids, &PyList_Type, &c.raw_edges, &PyDict_Type, &c.names,
            &PyDict_Type, &c.storage_ids, &c.want_saved, &c.read_modules, &c.record_of,
            &c.visit_modules, &c.custom_saved, &c.read_saved, &c.read_saved_seq, &c.record,
            &c.shape_of))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "gradscope.graph._cwalk.configure was not called");
        return NULL;
    }
    if ((c.texts = PyDict_New()) == NULL)
        return NULL;
    Stack stack = {NULL, 0, 0};
    int err = stack_push(&stack, start, NULL);
    PyObject *spare = NULL; /* an id made for a node seen before: the next one to visit gets it */
    while (!err && stack.size > 0) {
        Entry e = stack.items[--stack.size]; /* owned */
        /* look up and claim the id in one dict operation: a node seen before keeps its id */
        PyObject *nid = spare != NULL ? spare : node_id(c.nodes);
        spare = NULL;
        PyObject *got = nid ? PyDict_SetDefault(c.ids, e.fn, nid) : NULL;
        if (got != NULL && e.edge != NULL) /* the edge that led here points at the id now */
            Py_SETREF(*(PyObject **)((char *)e.edge + EDGE.off[E_DST]), Py_NewRef(got));
        if (got == NULL)
            err = -1;
        else if (got != nid) /* seen: no node was added, so nid is still the next id */
            spare = Py_NewRef(nid);
        else
            err = visit_node(&c, e.fn, nid, &stack);
        Py_XDECREF(nid);
        Py_DECREF(e.fn);
        Py_XDECREF(e.edge);
    }
    Py_XDECREF(spare);
    Py_DECREF(c.texts);
    stack_clear(&stack);
    if (err)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(make_edges_doc,
"make_edges(raw_edges, ids) -> raw_edges\n\n"
"Turns `raw_edges` into the graph's edge list, in place: the Edges the walk made stay as they\n"
"are (their dst ids were set when their node was popped), and each (src_id, dst, input_nr)\n"
"tuple appended from Python becomes a grad Edge, its dst (a node id, or an autograd node\n"
"that `ids` maps to one) resolved. Returns the same list.");

static PyObject *
make_edges(PyObject *self, PyObject *args)
{
    PyObject *raw, *ids;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &raw, &PyDict_Type, &ids))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "gradscope.graph._cwalk.configure was not called");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(raw); i++) {
        PyObject *item = PyList_GET_ITEM(raw, i);
        if (Py_TYPE(item) == EDGE.type)
            continue;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 3) {
            PyErr_SetString(PyExc_TypeError,
                            "make_edges: expected Edge or (src, dst, input_nr) items");
            return NULL;
        }
        PyObject *dst = PyTuple_GET_ITEM(item, 1);
        if (!PyUnicode_Check(dst)) {
            PyObject *found = PyDict_GetItemWithError(ids, dst);
            if (found == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_KeyError, "make_edges: %R was never walked", dst);
                return NULL;
            }
            dst = found;
        }
        PyObject *edge = new_edge(PyTuple_GET_ITEM(item, 0), dst, PyTuple_GET_ITEM(item, 2));
        if (edge == NULL)
            return NULL;
        PyList_SetItem(raw, i, edge); /* steals edge, drops the tuple */
    }
    return Py_NewRef(raw);
}

PyDoc_STRVAR(param_names_doc,
"param_names(params) -> dict | None\n\n"
"`{id(tensor): name}` for a dict of str -> tensor (what `_param_names` builds for one), in one\n"
"pass; None when a key is not exactly a str or a value is not a tensor, for the Python code to\n"
"handle (its error message, `str()` of the keys). A tensor under two names keeps the last.");

static PyObject *
param_names(PyObject *self, PyObject *params)
{
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "gradscope.graph._cwalk.configure was not called");
        return NULL;
    }
    if (!PyDict_CheckExact(params))
        Py_RETURN_NONE;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(params, &pos, &k, &v)) {
        if (!PyUnicode_CheckExact(k)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        int is_tensor = PyObject_TypeCheck(v, (PyTypeObject *)tensor_type);
        if (!is_tensor) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *key = PyLong_FromVoidPtr(v);
        if (key == NULL || PyDict_SetItem(out, key, k) < 0) {
            Py_XDECREF(key);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(key);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Node, fields, defaults, Edge, fields, TensorInfo, fields, SavedTensor, fields, "
     "class_entry, dtype_names, dtype_name, Tensor, storage_key): check the dataclasses' slot "
     "layouts and keep the helpers the walk needs."},
    {"walk", (PyCFunction)(void (*)(void))walk, METH_VARARGS | METH_KEYWORDS, walk_doc},
    {"make_edges", make_edges, METH_VARARGS, make_edges_doc},
    {"param_names", param_names, METH_O, param_names_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gradscope.graph._cwalk",
    "The compiled graph walk of gradscope.graph.walk (same results as the Python walker).", -1,
    methods,
};

#define INTERN(var, text) \
    if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__cwalk(void)
{
    INTERN(s_cpu, "cpu");
    INTERN(s_grad, "grad");
    INTERN(s_leaf, "leaf");
    INTERN(s_empty, "");
    INTERN(s_next_functions, "next_functions");
    INTERN(s_variable, "variable");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_device, "device");
    INTERN(s_untyped_storage, "untyped_storage");
    INTERN(s_data, "data");
    INTERN(s_nbytes, "nbytes");
    if ((i_one = PyLong_FromLong(1)) == NULL || (i_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
