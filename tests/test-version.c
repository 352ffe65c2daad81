// SPDX-License-Identifier: MIT
/*
 * The version three ways: the header's macros, the loaded library's
 * answers, and the project version meson passes as argv[1].  All must be
 * the same.
 */
#include <stdio.h>
#include <string.h>

#include <kvmdirty.h>

int main(int argc, char **argv)
{
	char macros[64];
	const char *lib = kvmdirty_version_string();
	int bad = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: test-version PROJECT-VERSION\n");
		return 2;
	}
	snprintf(macros, sizeof(macros), "%d.%d.%d", KVMDIRTY_VERSION_MAJOR, KVMDIRTY_VERSION_MINOR,
		 KVMDIRTY_VERSION_MICRO);
	if (strcmp(macros, argv[1])) {
		fprintf(stderr, "version macros %s, project version %s\n", macros, argv[1]);
		bad = 1;
	}
	if (strcmp(KVMDIRTY_VERSION_STRING, argv[1])) {
		fprintf(stderr, "KVMDIRTY_VERSION_STRING \"%s\", project version %s\n", KVMDIRTY_VERSION_STRING,
			argv[1]);
		bad = 1;
	}
	if (!lib || strcmp(lib, argv[1])) {
		fprintf(stderr, "kvmdirty_version_string() \"%s\", project version %s\n", lib ? lib : "(null)",
			argv[1]);
		bad = 1;
	}
	if (kvmdirty_version_major() != KVMDIRTY_VERSION_MAJOR || kvmdirty_version_minor() != KVMDIRTY_VERSION_MINOR) {
		fprintf(stderr, "kvmdirty_version_major/minor() %d.%d, macros %d.%d\n", kvmdirty_version_major(),
			kvmdirty_version_minor(), KVMDIRTY_VERSION_MAJOR, KVMDIRTY_VERSION_MINOR);
		bad = 1;
	}
	if (!bad)
		printf("version: %s (macros, library and project agree)\n", lib);
	return bad;
}
