/* Prototype: pack Python values into 8-byte slots and call cuLaunchKernel, in C. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **,
                        void **);
typedef int (*ctx_get_t)(void **);
typedef int (*ctx_set_t)(void *);
static launch_t cu_launch;
static ctx_get_t cu_ctx_get;
static ctx_set_t cu_ctx_set;

/* launch(function, context, grid, block, stream, format, *values) */
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 6) { PyErr_SetString(PyExc_TypeError, "launch: too few arguments"); return NULL; }
    void *function = PyLong_AsVoidPtr(args[0]);
    void *context = PyLong_AsVoidPtr(args[1]);
    unsigned long grid = PyLong_AsUnsignedLong(args[2]);
    unsigned long block = PyLong_AsUnsignedLong(args[3]);
    void *stream = PyLong_AsVoidPtr(args[4]);
    Py_ssize_t len; const char *format = PyBytes_AsString(args[5]); len = PyBytes_GET_SIZE(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t count = nargs - 6;
    if (count != len || count > 64) { PyErr_SetString(PyExc_ValueError, "launch: format and values differ"); return NULL; }
    uint64_t slots[64]; void *pointers[64];
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *v = args[6 + i];
        slots[i] = 0;
        switch (format[i]) {
        case 'Q': { unsigned long long u = PyLong_AsUnsignedLongLong(v); memcpy(&slots[i], &u, 8); break; }
        case 'q': { long long q = PyLong_AsLongLong(v); memcpy(&slots[i], &q, 8); break; }
        case 'i': { long q = PyLong_AsLong(v); int32_t w = (int32_t)q; memcpy(&slots[i], &w, 4); break; }
        case 'f': { float f = (float)PyFloat_AsDouble(v); memcpy(&slots[i], &f, 4); break; }
        case 'd': { double d = PyFloat_AsDouble(v); memcpy(&slots[i], &d, 8); break; }
        default: PyErr_SetString(PyExc_ValueError, "launch: unknown format"); return NULL;
        }
        pointers[i] = &slots[i];
    }
    if (PyErr_Occurred()) return NULL;
    void *current = NULL;
    cu_ctx_get(&current);
    if (current != context) cu_ctx_set(context);
    int status = cu_launch(function, (unsigned)grid, 1, 1, (unsigned)block, 1, 1, 0, stream, pointers, NULL);
    if (status) { PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel failed: %d", status); return NULL; }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "fastlaunch", NULL, -1, methods};

PyMODINIT_FUNC PyInit_fastlaunch(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) { PyErr_SetString(PyExc_ImportError, "libcuda.so.1 not found"); return NULL; }
    cu_launch = (launch_t)dlsym(lib, "cuLaunchKernel");
    cu_ctx_get = (ctx_get_t)dlsym(lib, "cuCtxGetCurrent");
    cu_ctx_set = (ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
    if (!cu_launch || !cu_ctx_get || !cu_ctx_set) { PyErr_SetString(PyExc_ImportError, "driver symbols missing"); return NULL; }
    return PyModule_Create(&module);
}
