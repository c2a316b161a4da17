/* The graph walk of gradscope._capture, compiled.
 *
 * The Python walker (gradscope/_capture.py, `_Walker.walk`) is the reference; this module does
 * the same walk, in the same order, with the same results, for a fraction of the cost: the
 * interpreter overhead of the loop and of building one `Node` per autograd node and one `Edge`
 * per edge is most of what a walk costs in pure Python.
 *
 * Only the CPython C API is used (no torch headers): autograd nodes are reached through their
 * Python wrappers (`next_functions`, `variable`, ...), exactly as the Python walker reaches them.
 * `Node`, `Edge` and `TensorInfo` are slotted dataclasses; their instances are allocated here
 * and their slots filled directly, which gives the object `__init__` would have built (every
 * field is set; `attrs` and `saved` get a fresh dict and list, as their default factories do).
 * `configure` checks the slot layout once, so a field added to a dataclass without updating
 * this file fails loudly at import rather than producing half-built objects.
 *
 * Per-node Python work (saved tensors, module paths, storage ids) stays in Python: the walk
 * calls `visit(fn, node, info)` and `leaf(acc_id, fn)` when the caller asks for it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_FIELDS 8

typedef struct {
    PyTypeObject *type;
    Py_ssize_t n;
    Py_ssize_t off[MAX_FIELDS];
} Layout;

enum { N_ID, N_NAME, N_KIND, N_MODULE, N_ATTRS, N_SAVED, N_TENSOR, N_ORDER, N_FIELDS };
enum { E_SRC, E_DST, E_INPUT_NR, E_KIND, E_GRAD_NORM, E_COUNT, E_FIELDS };
enum { T_NAME, T_SHAPE, T_DTYPE, T_DEVICE, T_STORAGE, T_FIELDS };

static Layout NODE, EDGE, TINFO;
static int configured = 0;

static PyObject *class_cache;   /* type -> (name, kind, info, is_accumulate) */
static PyObject *class_info_fn; /* gradscope._capture._class_info */
static PyObject *dtype_names;   /* dtype -> "float32" (shared with the Python walker) */
static PyObject *dtype_name_fn; /* gradscope._capture._dtype_name */

static PyObject *s_cpu, *s_grad, *s_leaf, *s_accumulate, *s_empty, *s_kind, *s_dunder_name;
static PyObject *s_next_functions, *s_variable, *s_shape, *s_dtype, *s_is_cpu, *s_device;
static PyObject *i_one, *i_zero;

static int
layout_init(Layout *L, PyObject *type, PyObject *names, Py_ssize_t expected)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure: expected a class");
        return -1;
    }
    PyObject *seq = PySequence_Fast(names, "configure: field names must be a sequence");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n != expected) {
        PyErr_Format(PyExc_RuntimeError,
                     "gradscope._cwalk: %s has %zd fields, this build fills %zd; "
                     "update gradscope/_cwalk.c", ((PyTypeObject *)type)->tp_name, n, expected);
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
                         "gradscope._cwalk: field %R of %s is not a __slots__ member",
                         PySequence_Fast_GET_ITEM(seq, i), ((PyTypeObject *)type)->tp_name);
            Py_DECREF(d);
            Py_DECREF(seq);
            return -1;
        }
        L->off[i] = ((PyMemberDescrObject *)d)->d_member->offset;
        Py_DECREF(d);
    }
    Py_DECREF(seq);
    L->type = (PyTypeObject *)Py_NewRef(type);
    L->n = n;
    return 0;
}

/* A new instance with every slot set to vals[i] (borrowed references; new ones are taken). */
static PyObject *
new_instance(Layout *L, PyObject **vals)
{
    PyObject *obj = L->type->tp_alloc(L->type, 0);
    if (obj == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < L->n; i++)
        *(PyObject **)((char *)obj + L->off[i]) = Py_NewRef(vals[i]);
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

static PyObject *
configure(PyObject *self, PyObject *args)
{
    PyObject *node_t, *node_f, *edge_t, *edge_f, *ti_t, *ti_f, *info_fn, *dnames, *dname_fn;
    if (!PyArg_ParseTuple(args, "OOOOOOOO!O", &node_t, &node_f, &edge_t, &edge_f, &ti_t, &ti_f,
                          &info_fn, &PyDict_Type, &dnames, &dname_fn))
        return NULL;
    /* all or nothing: a rejected layout leaves the previous configuration in place */
    Layout node = {NULL, 0, {0}}, edge = {NULL, 0, {0}}, tinfo = {NULL, 0, {0}};
    if (layout_init(&node, node_t, node_f, N_FIELDS) < 0
        || layout_init(&edge, edge_t, edge_f, E_FIELDS) < 0
        || layout_init(&tinfo, ti_t, ti_f, T_FIELDS) < 0) {
        Py_XDECREF(node.type);
        Py_XDECREF(edge.type);
        Py_XDECREF(tinfo.type);
        return NULL;
    }
    Py_XDECREF(NODE.type);
    Py_XDECREF(EDGE.type);
    Py_XDECREF(TINFO.type);
    NODE = node;
    EDGE = edge;
    TINFO = tinfo;
    Py_XSETREF(class_info_fn, Py_NewRef(info_fn));
    Py_XSETREF(dtype_names, Py_NewRef(dnames));
    Py_XSETREF(dtype_name_fn, Py_NewRef(dname_fn));
    PyObject *cache = PyDict_New();
    if (cache == NULL)
        return NULL;
    Py_XSETREF(class_cache, cache);
    configured = 1;
    Py_RETURN_NONE;
}

/* (name, kind, info, is_accumulate) for the class of an autograd node; borrowed. */
static PyObject *
class_entry(PyObject *cls)
{
    PyObject *entry = PyDict_GetItemWithError(class_cache, cls);
    if (entry != NULL || PyErr_Occurred())
        return entry;
    PyObject *info = PyObject_CallOneArg(class_info_fn, cls);
    if (info == NULL)
        return NULL;
    PyObject *kind = PyObject_GetAttr(info, s_kind);
    PyObject *name = kind ? PyObject_GetAttr(cls, s_dunder_name) : NULL;
    if (name == NULL) {
        Py_XDECREF(kind);
        Py_DECREF(info);
        return NULL;
    }
    int acc = PyUnicode_Check(kind) ? PyUnicode_Compare(kind, s_accumulate) == 0 : 0;
    entry = PyTuple_Pack(4, name, kind, info, acc ? Py_True : Py_False);
    Py_DECREF(kind);
    Py_DECREF(name);
    Py_DECREF(info);
    if (entry == NULL)
        return NULL;
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

/* "n<len(nodes)>", the next node id (PyUnicode_FromFormat's printf is a third of a walk). */
static PyObject *
node_id(PyObject *nodes)
{
    char buf[32];
    char *p = buf + sizeof(buf);
    size_t v = (size_t)PyList_GET_SIZE(nodes);
    do {
        *--p = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    *--p = 'n';
    Py_ssize_t len = buf + sizeof(buf) - p;
    PyObject *s = PyUnicode_New(len, 127); /* ASCII: no UTF-8 decoding */
    if (s != NULL)
        memcpy(PyUnicode_1BYTE_DATA(s), p, len);
    return s;
}

/* The `leaf` node of an AccumulateGrad: the variable's name, shape, dtype and device.
 * Mirrors `_Walker.add_leaf` with `storage=None` (storage ids are read only with saved=True,
 * and then the Python `add_leaf` runs instead). */
static int
add_leaf(PyObject *nodes, PyObject *raw_edges, PyObject *names, PyObject *acc_id, PyObject *fn)
{
    int ret = -1;
    PyObject *var = NULL, *lid = NULL, *key = NULL, *shape = NULL, *shape_list = NULL;
    PyObject *dtype = NULL, *dname = NULL, *is_cpu = NULL, *device = NULL, *dev = NULL;
    PyObject *tinfo = NULL;

    if ((var = PyObject_GetAttr(fn, s_variable)) == NULL)
        goto done;
    if ((lid = node_id(nodes)) == NULL)
        goto done;
    PyObject *name = NULL; /* borrowed */
    if (PyDict_GET_SIZE(names) > 0) {
        if ((key = PyLong_FromVoidPtr(var)) == NULL)
            goto done;
        if ((name = PyDict_GetItemWithError(names, key)) == NULL && PyErr_Occurred())
            goto done;
    }
    if (name == NULL)
        name = s_empty;
    int truthy = PyObject_IsTrue(name);
    if (truthy < 0)
        goto done;
    if ((shape = PyObject_GetAttr(var, s_shape)) == NULL
        || (shape_list = PySequence_List(shape)) == NULL
        || (dtype = PyObject_GetAttr(var, s_dtype)) == NULL)
        goto done;
    dname = PyDict_GetItemWithError(dtype_names, dtype);
    if (dname != NULL)
        Py_INCREF(dname);
    else if (PyErr_Occurred() || (dname = PyObject_CallOneArg(dtype_name_fn, dtype)) == NULL)
        goto done;
    if ((is_cpu = PyObject_GetAttr(var, s_is_cpu)) == NULL)
        goto done;
    if (is_cpu == Py_True)
        device = Py_NewRef(s_cpu);
    else if ((dev = PyObject_GetAttr(var, s_device)) == NULL
             || (device = PyObject_Str(dev)) == NULL)
        goto done;
    PyObject *tvals[T_FIELDS] = {truthy ? name : Py_None, shape_list, dname, device, Py_None};
    if ((tinfo = new_instance(&TINFO, tvals)) == NULL)
        goto done;
    if (append_steal(nodes, new_node(lid, name, s_leaf, tinfo)) < 0)
        goto done;
    ret = append_steal(raw_edges, new_edge(acc_id, lid, i_zero));
done:
    Py_XDECREF(var);
    Py_XDECREF(lid);
    Py_XDECREF(key);
    Py_XDECREF(shape);
    Py_XDECREF(shape_list);
    Py_XDECREF(dtype);
    Py_XDECREF(dname);
    Py_XDECREF(is_cpu);
    Py_XDECREF(dev);
    Py_XDECREF(device);
    Py_XDECREF(tinfo);
    return ret;
}

typedef struct {
    PyObject **items; /* owned references */
    Py_ssize_t size, cap;
} Stack;

static int
stack_push(Stack *s, PyObject *o)
{
    if (s->size == s->cap) {
        Py_ssize_t cap = s->cap ? s->cap * 2 : 256;
        PyObject **items = PyMem_Realloc(s->items, cap * sizeof(PyObject *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        s->items = items;
        s->cap = cap;
    }
    s->items[s->size++] = Py_NewRef(o);
    return 0;
}

static void
stack_clear(Stack *s)
{
    while (s->size > 0)
        Py_DECREF(s->items[--s->size]);
    PyMem_Free(s->items);
}

/* One node: give it its id, build its Node (and leaf), record its edges, push its inputs. */
static int
visit_node(PyObject *fn, Stack *stack, PyObject *nodes, PyObject *ids, PyObject *raw_edges,
           PyObject *names, PyObject *visit, PyObject *leaf)
{
    int ret = -1;
    PyObject *node = NULL, *nf = NULL, *k_obj = NULL;
    PyObject *nid = node_id(nodes);
    if (nid == NULL || PyDict_SetItem(ids, fn, nid) < 0)
        goto done;
    PyObject *entry = class_entry((PyObject *)Py_TYPE(fn));
    if (entry == NULL)
        goto done;
    PyObject *info = PyTuple_GET_ITEM(entry, 2);
    node = new_node(nid, PyTuple_GET_ITEM(entry, 0), PyTuple_GET_ITEM(entry, 1), Py_None);
    if (node == NULL || PyList_Append(nodes, node) < 0)
        goto done;
    if (visit != Py_None) {
        PyObject *r = PyObject_CallFunctionObjArgs(visit, fn, node, info, NULL);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    if (PyTuple_GET_ITEM(entry, 3) == Py_True) {
        if (leaf != Py_None) {
            PyObject *r = PyObject_CallFunctionObjArgs(leaf, nid, fn, NULL);
            if (r == NULL)
                goto done;
            Py_DECREF(r);
        }
        else if (add_leaf(nodes, raw_edges, names, nid, fn) < 0)
            goto done;
    }
    if ((nf = PyObject_GetAttr(fn, s_next_functions)) == NULL)
        goto done;
    if (!PyTuple_Check(nf)) {
        PyErr_Format(PyExc_TypeError, "next_functions of %R is not a tuple", fn);
        goto done;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(nf);
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
            || append_steal(raw_edges, new_edge(nid, nxt, k_obj)) < 0)
            goto done;
        Py_CLEAR(k_obj);
    }
    for (Py_ssize_t k = n - 1; k >= 0; k--) {
        PyObject *nxt = PyTuple_GET_ITEM(PyTuple_GET_ITEM(nf, k), 0);
        if (nxt == Py_None)
            continue;
        int seen = PyDict_Contains(ids, nxt);
        if (seen < 0 || (!seen && stack_push(stack, nxt) < 0))
            goto done;
    }
    ret = 0;
done:
    Py_XDECREF(nid);
    Py_XDECREF(node);
    Py_XDECREF(nf);
    Py_XDECREF(k_obj);
    return ret;
}

PyDoc_STRVAR(walk_doc,
"walk(start, nodes, ids, raw_edges, names, visit, leaf)\n\n"
"Depth-first preorder from the autograd node `start`, exactly as `_Walker.walk` does: appends a\n"
"Node per new autograd node (and a leaf Node after each AccumulateGrad) to `nodes`, maps each\n"
"node object to its id in `ids`, and appends (src_id, dst node or leaf id, input_nr) to\n"
"`raw_edges`. `visit(fn, node, info)` and `leaf(acc_id, fn)` are called when not None.");

static PyObject *
walk(PyObject *self, PyObject *args)
{
    PyObject *start, *nodes, *ids, *raw_edges, *names, *visit, *leaf;
    if (!PyArg_ParseTuple(args, "OO!O!O!O!OO", &start, &PyList_Type, &nodes, &PyDict_Type, &ids,
                          &PyList_Type, &raw_edges, &PyDict_Type, &names, &visit, &leaf))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "gradscope._cwalk.configure was not called");
        return NULL;
    }
    Stack stack = {NULL, 0, 0};
    if (stack_push(&stack, start) < 0)
        return NULL;
    while (stack.size > 0) {
        PyObject *fn = stack.items[--stack.size]; /* owned */
        int seen = PyDict_Contains(ids, fn);
        int err = seen < 0 ? -1
                  : seen  ? 0
                          : visit_node(fn, &stack, nodes, ids, raw_edges, names, visit, leaf);
        Py_DECREF(fn);
        if (err < 0) {
            stack_clear(&stack);
            return NULL;
        }
    }
    stack_clear(&stack);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(make_edges_doc,
"make_edges(raw_edges, ids) -> raw_edges\n\n"
"Turns `raw_edges` into the graph's edge list, in place: an Edge whose `dst` is still an\n"
"autograd node gets that node's id from `ids`, and a (src_id, dst, input_nr) tuple becomes a\n"
"grad Edge. Returns the same list.");

static PyObject *
make_edges(PyObject *self, PyObject *args)
{
    PyObject *raw, *ids;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &raw, &PyDict_Type, &ids))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "gradscope._cwalk.configure was not called");
        return NULL;
    }
    Py_ssize_t dst_off = EDGE.off[E_DST];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(raw); i++) {
        PyObject *item = PyList_GET_ITEM(raw, i);
        PyObject *edge = NULL, **dst_slot;
        if (Py_TYPE(item) == EDGE.type) {
            dst_slot = (PyObject **)((char *)item + dst_off);
        }
        else if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 3) {
            edge = new_edge(PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1),
                            PyTuple_GET_ITEM(item, 2));
            if (edge == NULL)
                return NULL;
            dst_slot = (PyObject **)((char *)edge + dst_off);
        }
        else {
            PyErr_SetString(PyExc_TypeError,
                            "make_edges: expected Edge or (src, dst, input_nr) items");
            return NULL;
        }
        PyObject *dst = *dst_slot;
        if (dst != NULL && !PyUnicode_Check(dst)) {
            PyObject *found = PyDict_GetItemWithError(ids, dst);
            if (found == NULL) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_KeyError, "make_edges: %R was never walked", dst);
                Py_XDECREF(edge);
                return NULL;
            }
            Py_SETREF(*dst_slot, Py_NewRef(found));
        }
        if (edge != NULL)
            PyList_SetItem(raw, i, edge); /* steals edge, drops the tuple */
    }
    return Py_NewRef(raw);
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(Node, fields, Edge, fields, TensorInfo, fields, class_info, dtype_names, "
     "dtype_name): check the dataclasses' slot layouts and keep the helpers the walk needs."},
    {"walk", walk, METH_VARARGS, walk_doc},
    {"make_edges", make_edges, METH_VARARGS, make_edges_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "gradscope._cwalk",
    "The compiled graph walk of gradscope._capture (same results as the Python walker).", -1,
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
    INTERN(s_accumulate, "accumulate");
    INTERN(s_empty, "");
    INTERN(s_kind, "kind");
    INTERN(s_dunder_name, "__name__");
    INTERN(s_next_functions, "next_functions");
    INTERN(s_variable, "variable");
    INTERN(s_shape, "shape");
    INTERN(s_dtype, "dtype");
    INTERN(s_is_cpu, "is_cpu");
    INTERN(s_device, "device");
    if ((i_one = PyLong_FromLong(1)) == NULL || (i_zero = PyLong_FromLong(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
