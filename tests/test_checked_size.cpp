// host/mk_size.h: the one checked multiply/add for counts from outside that meet an
// allocation. A wrapped product must be refused (and named), never turned into a small
// buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "core/mk_size.h"

namespace {

TEST(CheckedSize, MultiplyAndAddRefuseWhatWraps) {
    size_t out = 0;
    EXPECT_TRUE(mk_size_mul(3, 5, &out));
    EXPECT_EQ(out, 15u);
    EXPECT_TRUE(mk_size_mul(SIZE_MAX, 1, &out));
    EXPECT_EQ(out, SIZE_MAX);
    EXPECT_TRUE(mk_size_mul(0, SIZE_MAX, &out));
    EXPECT_EQ(out, 0u);
    // 2^62 tokens of 4 bytes: the `stage --max-tokens 4611686018427387904` case (wrapped to 0)
    EXPECT_FALSE(mk_size_mul((size_t)1 << 62, sizeof(int32_t), &out));
    EXPECT_EQ(out, SIZE_MAX) << "a refused product saturates";
    EXPECT_FALSE(mk_size_mul(SIZE_MAX / 2 + 1, 2, &out));
    EXPECT_TRUE(mk_size_mul(SIZE_MAX / 2, 2, &out));
    EXPECT_TRUE(mk_size_add(SIZE_MAX - 1, 1, &out));
    EXPECT_EQ(out, SIZE_MAX);
    EXPECT_FALSE(mk_size_add(SIZE_MAX, 1, &out));
    EXPECT_EQ(out, SIZE_MAX) << "a refused sum saturates (a context capped afterwards stays capped)";
}

TEST(CheckedSize, AllocArrayNamesWhatDidNotFit) {
    mk_clear_error();
    EXPECT_EQ(mk_alloc_array((size_t)1 << 62, sizeof(int32_t), "test tokens"), nullptr);
    const std::string m = mk_last_error();
    EXPECT_NE(m.find("test tokens: 4611686018427387904 elements of 4 bytes overflow"), std::string::npos) << m;
    size_t bytes = 0;
    EXPECT_EQ(mk_size_bytes(SIZE_MAX, 2, "x", &bytes), MK_ERR_OUT_OF_MEMORY);
    void *p = mk_alloc_array(0, 8, "nothing");
    EXPECT_NE(p, nullptr) << "zero elements still give a pointer to free";
    free(p);
    p = mk_alloc_array(16, 4, "sixteen");
    ASSERT_NE(p, nullptr);
    free(p);
}

// The one growth rule of the growing arrays (tokenizers, chat template, detokenizer, the
// scheduler's request table, the CLI and the server's buffers): `first` elements, then
// doubling until `need` fits, the elements kept; nothing changes when they fit already; a
// capacity that cannot double (or whose bytes wrap) is refused and named with the array
// left as it was.
TEST(CheckedSize, GrowArrayDoublesKeepsAndRefusesWhatWraps) {
    size_t cap = 0;
    int32_t *a = nullptr;
    ASSERT_EQ(mk_grow_array(&a, &cap, 1, sizeof(int32_t), 3, "test ids"), MK_OK);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(cap, 3u);
    for (int32_t i = 0; i < 3; i++) a[i] = 7 * i + 1;
    int32_t *const before = a;
    ASSERT_EQ(mk_grow_array(&a, &cap, 3, sizeof(int32_t), 3, "test ids"), MK_OK);
    EXPECT_EQ(a, before) << "room for `need` already: nothing moves";
    EXPECT_EQ(cap, 3u);
    ASSERT_EQ(mk_grow_array(&a, &cap, 4, sizeof(int32_t), 3, "test ids"), MK_OK);
    ASSERT_NE(a, nullptr);
    EXPECT_EQ(cap, 6u);
    for (int32_t i = 0; i < 3; i++) EXPECT_EQ(a[i], 7 * i + 1);
    ASSERT_EQ(mk_grow_array(&a, &cap, 13, sizeof(int32_t), 3, "test ids"), MK_OK);
    EXPECT_EQ(cap, 24u) << "doubled until 13 fit";
    for (int32_t i = 0; i < 3; i++) EXPECT_EQ(a[i], 7 * i + 1);
    mk_clear_error();
    size_t huge = SIZE_MAX / 2 + 1;
    int32_t *const kept = a;
    EXPECT_EQ(mk_grow_array(&a, &huge, huge + 1, 1, 3, "test heap"), MK_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(huge, SIZE_MAX / 2 + 1) << "a refused growth leaves the capacity";
    EXPECT_EQ(a, kept) << "a refused growth leaves the array";
    EXPECT_NE(std::string(mk_last_error()).find("test heap: 9223372036854775808 elements cannot double"),
              std::string::npos)
        << mk_last_error();
    size_t wide = (size_t)1 << 61; // doubles to 2^62, but 2^62 elements of 4 bytes wrap
    mk_clear_error();
    EXPECT_EQ(mk_grow_array(&a, &wide, wide + 1, sizeof(int32_t), 3, "test words"), MK_ERR_OUT_OF_MEMORY);
    EXPECT_EQ(wide, (size_t)1 << 61);
    EXPECT_EQ(a, kept);
    EXPECT_NE(std::string(mk_last_error()).find("test words: 4611686018427387904 elements of 4 bytes overflow"),
              std::string::npos)
        << mk_last_error();
    for (int32_t i = 0; i < 3; i++) EXPECT_EQ(a[i], 7 * i + 1) << "the array outlives a refused growth";
    free(a);
}

} // namespace
