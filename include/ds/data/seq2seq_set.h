#pragma once
// Sequence-to-sequence sets: what ds_prepare --task seq2seq writes and ds_train reads to train an
// encoder-decoder (models::Seq2Seq: BART, BlenderBot) on source -> target pairs
// (docs/data.md, "Seq2seq sets").
//
// Records: JSON Lines, one object per line with a source and a target string. The field names are
// --source_field / --target_field when given, else the first pair present of
// ("source", "target"), ("src", "tgt"), ("prompt", "response"), ("input", "output"),
// ("question", "answer"). Blank lines are skipped; a UTF-8 byte order mark on the first line is
// dropped. Every problem is a ds::Error "[seq2seq] FILE:LINE: ..." naming the field.
//
// Encoding (encode_seq2seq_text): transformers' tokenizer(text, truncation=True,
// max_length=max_length): the text's tokens, cut to max_length minus the post-processor's
// special tokens, inside the single-sequence template (BART's RoBERTa template: <s> x </s>; a
// tokenizer without a template, e.g. GPT-2's: the tokens as they are). The source is exactly that.
// The target (labels) is the same with eos appended when the template does not end with it (the
// cut then keeps room for it), so that the model learns to stop; labels are padded with -100.
//
// A folder holds meta.json (written last) and one file per split, <split>.s2s:
//   bytes 0-7    magic "DSSEQ2S1"
//   8-11         u32 version (1)
//   12-15        u32 S: source ids per example (--max_source_len)
//   16-19        u32 T: label ids per example (--max_target_len)
//   20-23        u32 vocab_size of the tokenizer
//   24-31        u64 N: examples
//   32-63        zero
//   64-          i32 source[N][S] (right-padded with pad_id), u32 source_len[N] (attention mask =
//                first source_len ones), i32 labels[N][T] (-100 after the target),
//                u32 target_len[N]
// all little-endian. meta.json: {"format": "DSSEQ2SEQ", "kind": "seq2seq", "version": 1,
// "tokenizer": {"path", "pad_id", "eos_id", "bos_id", ...}, "seq2seq": {"max_source_len",
// "max_target_len", "pad_id", "eos_id", "bos_id", "decoder_start_id", "source_field",
// "target_field", ...}, "split_rule", "splits": {"train": {"files", "examples", "truncated_source",
// "truncated_target"}, "val": ...}}. decoder_start_id is eos (BART and BlenderBot's convention) or,
// without one, bos. The frame both task sets share (header, meta.json, the train/val split of
// records) is written and read by ds/data/set_file.h.
//
// A split is read into memory whole. Thread safety: a loaded set is immutable; get() may be called
// from many threads; the functions are pure.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ds/data/text_tokenizer.h"

namespace ds::data {

inline constexpr char kSeq2SeqFormat[] = "DSSEQ2SEQ";
inline constexpr int kSeq2SeqVersion = 1;

// Whether dir/meta.json says "kind": "seq2seq" (false when it is missing or unreadable).
bool is_seq2seq_set(const std::filesystem::path& dir);

struct Seq2SeqRecord {
  std::string source, target;
  size_t line = 0;  // 1-based line in its file
};

// The records of one .jsonl file. source_field / target_field empty: the first known pair
// present in the first record (see the top); every record must then have both. Throws
// "[seq2seq] FILE:LINE: ..." for invalid JSON, a missing field or one that is not a string, and
// "[seq2seq] FILE: no records" for an empty file. *fields receives the names used.
std::vector<Seq2SeqRecord> read_seq2seq_file(const std::filesystem::path& path,
                                             const std::string& source_field = "",
                                             const std::string& target_field = "",
                                             std::pair<std::string, std::string>* fields = nullptr);

struct EncodedText {
  std::vector<int32_t> ids;
  bool truncated = false;
};
// One text as tokenizer(text, truncation=True, max_length=max_length) encodes it (see the top);
// append_eos: add eos_id at the end unless the template already put it there (the budget keeps
// room for it). Throws when max_length cannot hold the special tokens plus one token.
EncodedText encode_seq2seq_text(const TextTokenizer& tok, const std::string& text,
                                size_t max_length, bool append_eos = false, int32_t eos_id = -1);

class Seq2SeqSet {
 public:
  // Split `split` of a folder written by ds_prepare --task seq2seq. Throws
  // "[dataset] DIR/meta.json: ..." for another kind of folder, a missing split or version, and
  // "[dataset] FILE: ..." for a damaged file.
  static Seq2SeqSet open_split(const std::filesystem::path& dir, const std::string& split);

  int64_t size() const { return n_; }        // N
  int64_t source_len() const { return s_; }  // S
  int64_t target_len() const { return t_; }  // T
  int64_t vocab_size() const { return vocab_; }
  int32_t pad_id() const { return pad_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t bos_id() const { return bos_id_; }
  int32_t decoder_start_id() const { return start_id_; }
  const std::filesystem::path& dir() const { return dir_; }
  const std::filesystem::path& file() const { return file_; }
  const std::filesystem::path& tokenizer_path() const { return tokenizer_; }

  // Example i: S source ids (pad_id after its length), the attention mask (1 then 0) and T labels
  // (-100 after the target).
  void get(int64_t i, std::span<int32_t> source, std::span<int32_t> mask,
           std::span<int32_t> labels) const;
  // The unpadded source ids and target ids (labels without the -100 padding) of example i.
  std::vector<int32_t> source(int64_t i) const;
  std::vector<int32_t> target(int64_t i) const;

 private:
  std::filesystem::path dir_, file_, tokenizer_;
  int64_t n_ = 0, s_ = 0, t_ = 0, vocab_ = 0;
  int32_t pad_id_ = 0, eos_id_ = -1, bos_id_ = -1, start_id_ = 0;
  std::vector<int32_t> src_, labels_;
  std::vector<uint32_t> src_len_, tgt_len_;
};

struct Seq2SeqPrepareOptions {
  std::vector<std::filesystem::path> inputs;  // .jsonl files, or folders holding them
  std::filesystem::path tokenizer_dir;        // a Hugging Face tokenizer folder
  std::filesystem::path output_dir;
  size_t max_source_len = 128;             // S
  size_t max_target_len = 128;             // T
  std::string source_field, target_field;  // empty: detected (see the top)
  // Split rule (at most one): val_files (a glob choosing whole files), or val_fraction f: the last
  // ceil(f * records) records (files in path order) are val. Default 0.1 (0: no val).
  std::optional<double> val_fraction;
  std::string val_files;
};

struct Seq2SeqSplitReport {
  int64_t examples = 0, truncated_source = 0, truncated_target = 0;
  std::string file;  // relative to output_dir
};

struct Seq2SeqPrepareReport {
  Seq2SeqSplitReport train, val;
  std::vector<std::pair<std::string, int64_t>> files;  // input file, records
  std::string source_field, target_field;
  int32_t pad_id = 0, eos_id = -1, decoder_start_id = 0;
  std::string split_rule;
  std::filesystem::path meta;
  double seconds = 0;
};

// Reads, encodes and writes the set, meta.json last. Errors name the input file and line.
Seq2SeqPrepareReport prepare_seq2seq(const Seq2SeqPrepareOptions& options);

}  // namespace ds::data
