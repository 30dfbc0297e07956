/* version.c - libkvclient's version string. */
#include "client/kvclient.h"

const char *kvc_version(void) { return KV_VERSION; }
