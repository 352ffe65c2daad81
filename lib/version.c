// SPDX-License-Identifier: MIT
/* The runtime version: the numbers the library was built with, from meson.build. */
#include "export.h"
#include "kvmdirty.h"

KD_EXPORT int kvmdirty_version_major(void)
{
	return KVMDIRTY_VERSION_MAJOR;
}

KD_EXPORT int kvmdirty_version_minor(void)
{
	return KVMDIRTY_VERSION_MINOR;
}

KD_EXPORT const char *kvmdirty_version_string(void)
{
	return KVMDIRTY_VERSION_STRING;
}
