// SPDX-License-Identifier: MIT
/*
 * libFuzzer harness over kvmdirty-migrate plot: each input is a stats
 * file.  Beyond what the sanitizers catch, it stops on a refusal without
 * a one-line reason, and on a picture that is not well-formed XML
 * (xml-check.h) or that refers outside itself.  Built with clang by
 * tests/fuzz/meson.build; run by run-fuzz.sh from the recorded stats
 * (tests/data).
 */
#define _GNU_SOURCE /* memmem */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"
#include "xml-check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct mig_plot *p;
	struct xml_check x;
	char err[256] = "", title[65], *svg = NULL;
	size_t n = size < 64 ? size : 64;
	FILE *f;
	int ret;

	ret = mig_plot_read((const char *)data, size, &p, err, sizeof(err));
	if (ret < 0) {
		if (!err[0] || strchr(err, '\n')) {
			fprintf(stderr, "refused without a one-line reason: '%s'\n", err);
			abort();
		}
		return 0;
	}
	/* the input's first bytes as the file name: escaped too */
	memcpy(title, data, n);
	title[n] = 0;
	n = 0;
	f = open_memstream(&svg, &n);
	if (!f || mig_plot_svg(p, title, f) < 0 || fclose(f))
		abort();
	if (xml_check(&x, svg, n) < 0) {
		fprintf(stderr, "not well-formed: %s\n", x.why);
		abort();
	}
	/* markup, not text: in text '<' and '"' are escaped */
	if (memmem(svg, n, "<script", 7) || memmem(svg, n, "href=\"", 6)) {
		fprintf(stderr, "the picture refers outside itself\n");
		abort();
	}
	free(svg);
	mig_plot_free(p);
	return 0;
}
