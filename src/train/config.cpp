#include "seqforge/train/config.hpp"

#include <yaml-cpp/depthguard.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "io/file_util.hpp"
#include "seqforge/core/error.hpp"
#include "train/yaml_limits.hpp"

namespace seqforge {

namespace {

using T = ConfigKey::Type;

const std::vector<ConfigKey> kKeys = {
    {"data.path", T::path, "",
     "The data: a .csv file or a 2-D .npy array (forecast, classify, mae; an array's columns are "
     "named \"0\", \"1\", ...), or a text file (charlm). Required."},
    {"data.task", T::string, "forecast",
     "`forecast` (predict target columns `horizon` steps after a window), `classify` (predict the "
     "class `horizon` steps after a window), `mae` (masked-autoencoder pre-training: reconstruct "
     "the file's features of randomly masked time steps), `charlm` (character language model), "
     "`lm` (language model on the tokens of data.tokenizer; model.family decoder), or "
     "`text_classify` (the class of a text, or of a pair of texts, per CSV row; a transformer)."},
    {"data.tokenizer", T::path, "",
     "lm: a Hugging Face tokenizer.json (BPE: GPT-2, Llama 3, Qwen, Gemma style, or one from "
     "`seqforge tokenizer train`). Empty: model.init_from's folder's tokenizer.json."},
    {"data.features", T::string_list, "[]",
     "CSV columns fed to the model. Empty: every column but the date and class columns."},
    {"data.targets", T::string_list, "[]",
     "CSV columns to predict (forecast). Required for forecast."},
    {"data.date_column", T::string, "",
     "The column of each row's time: dates or date-times (ISO 8601 `2012-01-31`, "
     "`2012-01-31 13:45`, `2012-01-31 13:45:07.250` to the microsecond, `2012/01/31`, `2012-01` "
     "for a month; `20120131`; day or month first, "
     "`31/01/2012`, `01/31/2012 1:45 PM`, `31.01.2012`: see data.date_order), or numbers "
     "(elapsed seconds, a Unix time, a sample index; in their own units, with no calendar: "
     "data.calendar, data.frequency and data.holidays need dates). Rows are ordered by it within "
     "each series; never a feature. Predictions write the dates as ISO 8601."},
    {"data.date_order", T::string, "auto",
     "Dates written with the day and the month first (`01/02/2012`): `dmy` (day first), `mdy` "
     "(month first) or `auto`: the order a day past 12 in the column shows (31/01/2012: day "
     "first); a column where no field is past 12 is an error asking for dmy or mdy."},
    {"data.series_column", T::string, "",
     "CSV column naming the series when one file holds several (a battery cell, a city, a "
     "ticker); never a feature. Each series is ordered by its own dates, windows never cross "
     "series, time splits cut every series, and normalisation is fitted on all series' training "
     "parts. Empty: the file is one series (then rows with equal dates are an error)."},
    {"data.transform", T::string_map, "{}",
     "Per-column transforms applied before windowing and normalisation, e.g. `{close: "
     "log_return, volume: log}`: `log` (ln x), `diff` (x_t - x_{t-1}), `log_return` (ln(x_t / "
     "x_{t-1})), `pct_change` (x_t / x_{t-1} - 1). A target's transform spans the horizon (the "
     "change from the window's last row to the target row), and predictions and errors are "
     "turned back into the column's own units. A differencing transform of a feature drops each "
     "series' first row."},
    {"data.class_column", T::string, "",
     "CSV column of class names (classify, text_classify); classes are numbered in sorted order "
     "(by value where every class is a number: 2 before 10). "
     "classify: an empty or missing cell (NA, ...) is a row without a class, and the windows "
     "whose class it would give are left out (a few labelled rows among many), with a note."},
    {"data.label", T::string, "column",
     "classify: `column` (the class column), `direction` (`up` when label_column is higher "
     "`horizon` steps after the window's last row, else `down`) or `volatility` (`high` when the "
     "realised volatility of label_column's log returns over the `horizon` rows after the window "
     "is above its median over the training windows, else `low`; class 0 is `low`, 1 `high`)."},
    {"data.label_column", T::string, "",
     "classify with label `direction`: the numeric column whose direction is the class."},
    {"data.label_fraction", T::number, "1.0",
     "Share of the training windows that are labeled and used (a fixed random subset, by "
     "train.seed)."},
    {"data.mask_ratio", T::number, "0.15",
     "mae: each time step's chance of being masked (every input zeroed) and its file's features "
     "reconstructed, "
     "drawn step by step (at least one step a window; new steps each training epoch, from "
     "train.seed and the epoch; at every evaluation the same ones, whatever train.seed, so runs "
     "with other seeds are scored on the same steps)."},
    {"data.lookback", T::integer, "24", "Time steps in each input window."},
    {"data.horizon", T::integer, "1",
     "How many steps after the window's last row the target lies (1 = the next row; classify "
     "also takes 0, the class at the window's last row)."},
    {"data.horizon_mode", T::string, "direct",
     "forecast: `direct` (one output per step ahead, 1 to data.horizon, from one window: "
     "data.horizon x targets outputs; eval reports each step's errors and predict writes one row "
     "per window and step) or `last` (one output, data.horizon steps ahead). Runs written before "
     "this key are `last`."},
    {"data.stride", T::integer, "1", "Rows between the starts of consecutive windows."},
    {"data.calendar", T::string_list, "[]",
     "Features derived from data.date_column, known for any date: `hour`, `dayofweek`, "
     "`dayofmonth`, `dayofyear`, `month`, each as the sine and cosine of its cycle (features "
     "`hour_sin`, `hour_cos`, ...) after the file's features, so that 23:00 lies next to 00:00 "
     "and December next to January. Dates are read as UTC."},
    {"data.known_future", T::string_list, "[]",
     "forecast: CSV columns known ahead of time (a planned promotion, a holiday flag, a weather "
     "forecast): every step of a window also gets their values at the rows its forecast is for "
     "(features `<column>+<n>`, n rows ahead, one per step ahead with data.horizon_mode direct). "
     "predict needs those rows in the file: future rows at a series' end with the known columns "
     "filled and the other cells empty; a window whose known values are not in the file is left "
     "out, with a note. A name of data.calendar (`hour`, `dayofweek`, ...) is that feature at the "
     "rows forecast, from their dates, past the file's end too where the dates are regular. The "
     "values ahead are numbers, read as written: a data.transform of the column changes its "
     "feature in the window, not them."},
    {"data.static", T::string_list, "[]",
     "CSV columns naming a category of each series that does not change over time (a battery's "
     "cell type, a store's region): one value per series (a change within one is an error naming "
     "the line), fed to the model as a one-hot feature per category (`<column>=<category>`, after "
     "the calendar's), which the first layer's weights turn into a learnt embedding of the "
     "category. The categories are the training file's; predict and eval refuse a category the "
     "model was not trained on, naming the series."},
    {"data.categorical", T::string_list, "[]",
     "CSV columns of text whose value may change from row to row (the day's weather, a machine's "
     "mode), each fed to the model as a one-hot feature per category (`<column>=<category>`, after "
     "data.static's); an empty or missing cell is no category (all 0). The categories are the "
     "training file's (at most 256 per column); at predict and eval a category the model was not "
     "trained on is all 0 too, with a note."},
    {"data.missing", T::string, "error",
     "Missing cells of the feature and target columns: empty ones, the words written for a "
     "missing value (NA, N/A, NaN, null, None, #N/A, <NA>; any case) and data.missing_values "
     "(NaN in a .npy array): `error` (one line "
     "naming the file, line and column), `ffill` (each takes the last value before it in its "
     "series; an empty cell before any value is an error), `interpolate` (linear between the "
     "values before and after it in its series; at a series' ends, the nearest value) or `mask` "
     "(a missing input is 0 once normalised: the column's training mean under zscore, its "
     "training minimum under minmax, 0 under none; and a feature "
     "<column>_missing per file feature is 1 there and 0 elsewhere, normalised as every input; a "
     "window whose target is missing is left "
     "out of training and evaluation, and the masked autoencoder (data.task mae) masks and "
     "reconstructs only steps that hold every feature, so no loss term is a missing value). "
     "Counts "
     "per column are a note at start-up. Missing target cells of a file given to predict or eval "
     "--data stay values not known yet."},
    {"data.missing_words", T::boolean, "true",
     "Whether the words written for a missing value (NA, N/A, NaN, null, None, #N/A, <NA>; any "
     "case) mark one in a CSV, as pandas' read_csv takes them; false: only empty cells and "
     "data.missing_values do (pandas' keep_default_na=False), so a class or category 'None' or "
     "'NA' is one. The Python package sets it for a data frame, which holds a missing cell apart "
     "from such a text."},
    {"data.missing_values", T::string_list, "[]",
     "More cells that mark a missing value, as data.missing treats them: numbers (`-99.99` "
     "matches every cell of that value, -99.990 too) or texts (`n.a.`). A column holding a "
     "number of nines (-99.99, -999, 9999) far outside its other values gets a note at start-up "
     "naming it."},
    {"data.frequency", T::string, "auto",
     "The dates' calendar (with data.date_column): `auto` (the usual step between rows, calendar "
     "months, or business days when every date is a weekday one day apart but for weekends), `B` "
     "(business days: Monday to Friday less data.holidays; a weekend or holiday date is an error), "
     "`M`, `Q`, `Y` (calendar months, quarters, years) or a step (`250ms`, `s`, `15min`, `h` or "
     "`H`, `6h`, `D`, `W`; a "
     "date off it is an error). Longer steps are gaps (a note at start-up), and predict dates "
     "forecasts past the file's end by it."},
    {"data.holidays", T::path, "",
     "A file of dates that are no business days (one ISO date per line, or the first field of a "
     "CSV line; a header line and # comments are skipped), for data.frequency B (or auto "
     "finding business days): a step over one is no gap, and predict's dates skip them."},
    {"data.season", T::integer, "0",
     "forecast: the season's length in rows (24 for hourly data with a daily cycle, 7 for daily "
     "data with a weekly one): evaluation adds the seasonal-naive forecast's errors (each "
     "target predicted by the value one season before it) and MASE scales by the training "
     "part's seasonal differences. 0: no season (MASE scales by one-step differences)."},
    {"data.seq_len", T::integer, "128",
     "Characters per training sequence (charlm); the most characters of an example "
     "(text_classify: a longer text is cut at its end; a pair as Hugging Face's fast tokenizers "
     "cut one, longest_first: the longer text alone where the shorter fits in half, else both to "
     "half, the separator kept)."},
    {"data.text_columns", T::string_list, "[]",
     "text_classify: the CSV column of each example's text, or two columns, a pair (text A, then "
     "data.separator, then text B, with segment embeddings telling them apart). lm: one column "
     "whose rows are documents, their tokens joined with data.eos_token after each (empty: the "
     "file is one text)."},
    {"data.eos_token", T::string, "",
     "lm on data.text_columns: the token ending each document (row). Empty: "
     "tokenizer_config.json's "
     "eos_token beside the tokenizer, else model.init_from's config.json eos_token_id."},
    {"data.separator", T::string, "\n",
     "text_classify: the characters between text A and text B of a pair (part of text A's "
     "segment)."},
    {"data.split.train", T::number, "0.8",
     "Share of the data for training: the first rows (time series) or the first characters "
     "(text), floor(n train) of n."},
    {"data.split.val", T::number, "0.1",
     "Share for validation, right after the training part (up to floor(n (train + val))); the "
     "rest is the test split. No target "
     "crosses a boundary (see data.split.context for the inputs; model.output every_step for its "
     "earlier steps). 0: no validation on purpose (no "
     "val_* metrics; early stopping and "
     "`save: best` watch train_loss). A positive share too small for one window is an error."},
    {"data.split.mode", T::string, "time",
     "`time`: train, validation and test follow each other in time. `random`: whole windows (or "
     "text chunks) dealt at random with train.seed, for data whose windows are independent "
     "samples (overlapping windows would leak rows across splits)."},
    {"data.split.by", T::string, "rows",
     "Time splits of several series: `rows` (every series cut at the same fractions of its own "
     "rows) or `date` (every series cut at two shared dates: those fractions of all rows' dates "
     "pooled; needs data.date_column)."},
    {"data.split.context", T::string, "history",
     "Time splits of a series: `history` (a validation or test window takes its lookback from the "
     "rows before its split, training rows included, as darts' and Keras' users forecast; only "
     "its target must lie in the split, so each split scores every target it holds that has a "
     "full lookback behind it) or `strict` (whole windows inside their split: a split scores "
     "only the targets a lookback after its start). A masked autoencoder (mae), whose targets "
     "are its whole window, is always strict."},
    {"data.normalize_per", T::string, "all",
     "`all`: one scaler per column, fitted on every series' training rows. `series`: one per "
     "series and column, each fitted on its own series' training rows (series of different "
     "levels, battery cells of different capacities) and stored in the checkpoint under the "
     "series' names; predictions are scaled back with their own series' scaler. The one-hot "
     "columns of data.static and data.categorical keep the pooled scaler (a series' own would "
     "make its constant category 0 in every series)."},
    {"data.normalize_fallback", T::string, "error",
     "With data.normalize_per series, a series that has no scaler of its own (absent from the "
     "training data, or without a training window): `error` (one line naming it) or `pooled` "
     "(the scaler of all series' training rows, said once)."},
    {"data.normalize", T::string, "zscore",
     "`zscore`, `minmax` or `none`: feature and target scaling, fitted on the rows the training "
     "windows span, from each one's first input to its last target (the training split's rows, "
     "fewer where data.stride > 1 skips some; with data.label_fraction or unlabelled rows, every "
     "training window's, labelled or not), and stored in the checkpoint. zscore's standard "
     "deviation is the population one (ddof 0, as scikit-learn's StandardScaler)."},
    {"data.num_workers", T::string, "auto",
     "Threads assembling batches ahead of the training loop (windows, masks, augmentations): a "
     "count, 0 (assembled by the training loop itself), or `auto` (a quarter of the cores, at "
     "least 1, fewer when the prefetched batches would fill an eighth of the free memory). The "
     "batches are the same for any count."},
    {"data.prefetch_factor", T::integer, "2", "Batches each worker assembles ahead."},
    {"augment.jitter.p", T::number, "0.0",
     "Probability that a training window's values get Gaussian noise added (time series; the "
     "file's features and data.known_future's, never dates' phases, categories, missing "
     "indicators or missing cells; a forecast's targets and a class stay the file's, a masked "
     "autoencoder reconstructs the augmented window)."},
    {"augment.jitter.sigma", T::number, "0.03",
     "Jitter: the noise's standard deviation, in normalised units."},
    {"augment.scaling.p", T::number, "0.0",
     "Probability that a training window's values are multiplied, each feature by a random "
     "factor of its own."},
    {"augment.scaling.sigma", T::number, "0.1",
     "Scaling: the factors' standard deviation around 1."},
    {"augment.magnitude_warp.p", T::number, "0.0",
     "Probability that a training window's values are multiplied, each feature by a smooth "
     "random curve around 1 of its own (Catmull-Rom through knots evenly spaced from the first "
     "step to the last)."},
    {"augment.magnitude_warp.sigma", T::number, "0.2",
     "Magnitude warp: the curve's knots' standard deviation around 1."},
    {"augment.magnitude_warp.knots", T::integer, "4", "Magnitude warp: inner knots of the curve."},
    {"augment.time_warp.p", T::number, "0.0",
     "Probability that a training window's time axis is smoothly sped up and slowed down, its "
     "first and last steps kept (values resampled by linear interpolation, derived features and "
     "missing cells from the nearer step; not with model.output every_step)."},
    {"augment.time_warp.sigma", T::number, "0.2",
     "Time warp: the speed curve's knots' standard deviation around 1."},
    {"augment.time_warp.knots", T::integer, "4", "Time warp: inner knots of the speed curve."},
    {"augment.window_slice.p", T::number, "0.0",
     "Probability that a slice of a training window is stretched back to its full length, "
     "resampled as by time_warp (a forecast's or classifier's slice ends at the window's last "
     "step, which its target follows; a masked autoencoder's starts at random; not with "
     "model.output every_step)."},
    {"augment.window_slice.ratio", T::number, "0.9",
     "Window slicing: the slice's share of the window."},
    {"augment.cache", T::boolean, "false",
     "Generate cache_versions augmented versions of every training window once, store them as "
     ".npy under a fingerprint of the data and these options (with a checksum), and draw from them "
     "in later epochs and runs."},
    {"augment.cache_versions", T::integer, "4", "Augmented versions per window in the cache."},
    {"augment.cache_dir", T::path, "",
     "Where the cache lives; empty: `augment/` in seqforge's cache directory (SEQFORGE_CACHE_DIR, "
     "else ~/.cache/seqforge)."},
    {"model.family", T::string, "recurrent",
     "`recurrent` (an LSTM-family network, model.cell), `transformer` (GPT-2 style, "
     "pre-LayerNorm, nanoGPT's parameter names: model.embedding wide, model.layers blocks of "
     "model.heads heads; data.task charlm), or `decoder` (a Hugging Face Llama or Qwen2 model: "
     "model.init_from names its folder, whose config.json gives every size; data.task lm)."},
    {"model.cell", T::string, "lstm",
     "Recurrent cell: `lstm` (PyTorch's nn.LSTM), `gru` (nn.GRU) or `lnlstm` (layer-normalised "
     "LSTM, Ba et al. 2016: layer norms with gains on the input and recurrent projections and on "
     "the cell state); also the module's name in checkpoints (lstm.weight_ih_l0, gru..., "
     "lnlstm.ln_ih_weight_l0)."},
    {"model.hidden", T::integer, "64", "Hidden size of the recurrent layers."},
    {"model.proj_size", T::integer, "0",
     "LSTM projection (PyTorch's proj_size): h = W_hr (o tanh(c)) has this many features, fewer "
     "than model.hidden (lstm.weight_hr_l0); 0: none."},
    {"model.layers", T::integer, "1", "Recurrent layers, or transformer blocks."},
    {"model.heads", T::integer, "4",
     "Transformer: attention heads; model.embedding must be a multiple of them."},
    {"model.checkpoint_activations", T::boolean, "false",
     "Transformer or decoder: activation checkpointing; forward keeps only each block's output "
     "and backward recomputes a block's activations before its gradients (about a third more "
     "compute, a fraction of the activation memory)."},
    {"model.bias", T::boolean, "true",
     "Transformer: biases in the Linears and LayerNorms (nanoGPT's bias; its train.py defaults to "
     "false, and so do checkpoints trained with it). With model.init_from, the base's."},
    {"model.block_size", T::integer, "0",
     "Transformer: the longest sequence it takes (rows of transformer.wpe.weight); 0: "
     "data.seq_len."},
    {"model.output", T::string, "last",
     "`last` (the head reads the last step's output, PyTorch's `output[:, -1]`: one loss term per "
     "window), `final_states` (forecast and classify: the head reads each direction's final "
     "state, PyTorch's `torch.cat([h_n[-2], h_n[-1]], 1)`: the forward direction's last step and "
     "the backward direction's first, where with `last` a bidirectional model's backward half "
     "has read the last step only; for a unidirectional model the two are one) or `every_step` "
     "(forecast: a forecast after every step of the window, each of the targets that follow "
     "that step, as Keras' return_sequences=True: the loss covers every step, so stateful training "
     "learns from every row, not one per chunk; evaluation, predict and the errors use the last "
     "step's forecast, val_loss every step's: with data.split.context history the earlier steps of "
     "a split's first windows forecast rows of the split before, as their inputs read them; "
     "`strict` keeps every step's target inside its split)."},
    {"model.bidirectional", T::boolean, "false",
     "Bidirectional recurrent layers; for a transformer (text_classify), an encoder: every token "
     "attends to every token of its example, not only to those before it. Not for charlm, whose "
     "every step predicts the next character from those before it."},
    {"model.dropout", T::number, "0.0",
     "Dropout rate in training: on every recurrent layer's output but the last (standard), or "
     "as model.dropout_mode says; for a transformer, on the embeddings and each block's two "
     "residual branches."},
    {"model.dropout_mode", T::string, "standard",
     "`standard`: a new mask at every step, between layers (PyTorch's nn.LSTM dropout). "
     "`variational`: masks drawn once per sequence and kept for all its steps, on every layer's "
     "input (the data's features or embeddings too) and on the recurrent state feeding W_hh "
     "(Gal & Ghahramani 2016; Keras' dropout and recurrent_dropout)."},
    {"model.embedding", T::integer, "64",
     "Embedding size (charlm); a transformer's width (nanoGPT's n_embd)."},
    {"model.init_from", T::path, "",
     "A .safetensors file of initial weights under PyTorch names (lstm.weight_ih_l0, head.weight, "
     "transformer.h.0.attn.c_attn.weight, ...; nanoGPT's attention-mask buffers are skipped), or "
     "a run directory (its model.safetensors). A character model (charlm, text_classify) takes "
     "the vocabulary the file's run was trained on, so every id keeps its character; a "
     "character outside it is an error. A transformer takes the base's shape: model.embedding, "
     "model.layers, model.block_size and model.bias from its tensors, model.heads from the "
     "seqforge config it was saved with (a checkpoint without one, such as nanoGPT's, needs "
     "model.heads); keys the config gives must match. A tied pair saved once (lm_head.weight "
     "only) loads the embedding; names under torch.compile's _orig_mod. prefix are read as the "
     "names."},
    {"model.from_config", T::boolean, "false",
     "model.family decoder: a new model of the shape model.init_from's config.json gives, "
     "initialised as Hugging Face initialises it (from_config: pre-training); the folder's "
     "weights are not read."},
    {"model.init_from_modules", T::string_list, "[]",
     "Load only these modules (`embedding`, the cell's `lstm`, `gru` or `lnlstm`, `head`) from "
     "init_from; "
     "the file's tensors of other modules are ignored, and a listed module's must be the "
     "model's (a layer or a direction more is an error). Empty: every parameter."},
    {"adapter.kind", T::string, "none",
     "Transformer fine-tuning with low-rank adapters on a frozen model (PEFT's): `none`, `lora` "
     "(y = x W0^T + b + (alpha/rank) x A^T B^T) or `dora` (y = m (x V^T) / ||V|| + b, V = W0 + "
     "(alpha/rank) B A, the norm per output row); only the adapters train, saved under PEFT's "
     "names (base_model.model.<linear>.lora_A.weight, lora_B.weight, "
     "lora_magnitude_vector). Load the base with model.init_from."},
    {"adapter.rank", T::integer, "8",
     "Adapter rank r (A is r x in, B out x r). As in PEFT, a rank above a layer's min(in, out) is "
     "allowed; the update B A then has rank min(in, out) at most."},
    {"adapter.alpha", T::number, "16", "Adapter scale numerator: the update is alpha/rank B A."},
    {"adapter.dropout", T::number, "0.0",
     "Adapter dropout in training. Transformers: on the adapted Linear's input (PEFT's "
     "lora_dropout). Recurrent layers, whose recurrence runs on the folded weight: on the "
     "entries of A, a new mask each step (DropConnect, as AWD-LSTM's weight drop)."},
    {"adapter.targets", T::string_list, "[]",
     "The weights that get an adapter: Linears of every transformer block (`attn.c_attn`, "
     "`attn.c_proj`, `mlp.c_fc`, `mlp.c_proj`), or a recurrent layer's weights in every layer "
     "and direction (`lstm.weight_ih`, `lstm.weight_hh`, `lstm.weight_hr`; `gru.` and `lnlstm.` "
     "likewise). "
     "Empty: all four Linears, or weight_ih and weight_hh."},
    {"adapter.base_precision", T::string, "fp32",
     "How the frozen base's weights are held in memory (the targeted ones; a decoder's: every "
     "Linear's): `fp32`, or `bf16` (half the memory, as a base loaded in bf16: the run's "
     "checkpoint and merge hold them rounded to bf16; training needs bf16 GEMMs, train.precision "
     "bf16; eval, predict and merge without them hold the base in fp32, with a note)."},
    {"optim.kind", T::string, "adamw", "`adamw`, `adam` or `sgd`."},
    {"optim.lr", T::number, "0.001", "Peak learning rate."},
    {"optim.weight_decay", T::number, "auto",
     "Weight decay: decoupled for adamw, L2 for adam and sgd. `auto`: 0.01 for adamw, 0 for adam "
     "and sgd (PyTorch's defaults)."},
    {"optim.decay_params", T::string, "auto",
     "The parameters weight decay applies to: `all` (as torch.optim over model.parameters()) or "
     "`matrices` (every tensor of two or more dimensions: weights and embeddings, the head's "
     "too, not biases nor LayerNorm parameters: nanoGPT's groups). "
     "`auto`: matrices for model.family transformer, all for recurrent models and for "
     "model.family decoder (torch.optim.AdamW over a Hugging Face model's parameters)."},
    {"optim.beta1", T::number, "0.9", "Adam beta1."},
    {"optim.beta2", T::number, "0.999", "Adam beta2."},
    {"optim.eps", T::number, "1e-08", "Adam epsilon."},
    {"optim.momentum", T::number, "0.0", "SGD momentum."},
    {"optim.nesterov", T::boolean, "false", "SGD Nesterov momentum."},
    {"train.epochs", T::integer, "10", "Passes over the training split."},
    {"train.batch_size", T::integer, "64",
     "Windows (or sequences) per step; an epoch's last batch holds what is left, however few "
     "(PyTorch's DataLoader with drop_last False)."},
    {"train.micro_batch_size", T::integer, "0",
     "Windows (or sequences) run through forward and backward at once; 0: the whole batch. A "
     "batch runs as micro-batches of this size whose gradients add up before the step "
     "(gradient accumulation): the same step, with the activations of one micro-batch in "
     "memory. `auto`: the whole batch where its step fits the memory (on a GPU, 90% of its "
     "free memory with the parameters, gradients and AdamW's moments; on a CPU, activations "
     "in half the available memory), else the largest micro-batch that does; start-up says "
     "which, and config.resolved.yaml holds the number. Not with train.stateful (`auto` keeps "
     "a stateful run's batch whole)."},
    {"train.max_batches", T::integer, "0", "Steps per epoch at most; 0: the whole training split."},
    {"train.progress_seconds", T::number, "30",
     "Without a terminal, a progress line (batches, loss, samples/s, ETA) at least this often "
     "during an epoch; 0: none. On a terminal the line is redrawn in place."},
    {"train.seed", T::integer, "0", "Seed for initialisation, shuffling and dropout."},
    {"train.loss", T::string, "mse",
     "The regression tasks' loss (forecast, mae), PyTorch's mean over the values: `mse`, `mae` "
     "(F.l1_loss: less pulled by outliers), `huber` (F.huber_loss with delta "
     "train.huber_delta: squared within it, linear beyond) or, forecast only, `quantile` (the "
     "pinball loss max(q (y - p), (q - 1) (y - p)) of each of train.quantiles: the model forecasts "
     "every quantile of every target and step; eval adds val_coverage, the share of actuals "
     "between the lowest and highest quantile, and the errors are the median's, or the quantile "
     "nearest 0.5). val_loss is this loss; forecast also reports val_mse, val_mae and the "
     "baselines whatever it is."},
    {"train.quantiles", T::string_list, "[0.1, 0.5, 0.9]",
     "`quantile` loss: the quantiles forecast, ascending, each between 0 and 1 (at most 16); "
     "the loss is the pinball loss's mean over every output. The head's outputs are ordered by "
     "step ahead, then target, then quantile (quantiles changing fastest). "
     "predict writes a column per quantile (<target>_q0.1, ...), sorted per forecast so that "
     "quantiles never cross."},
    {"train.huber_delta", T::number, "1.0",
     "`huber`: where the loss turns from squared to linear, in normalised units."},
    {"train.precision", T::string, "auto",
     "`fp32`, `bf16` (bf16 GEMMs, f32 master weights and state), `fp16` (fp16 GEMMs with dynamic "
     "loss scaling as PyTorch's GradScaler: scale 65536 to start, doubled after 2000 clean steps, "
     "halved and the step skipped on an inf or NaN gradient; on GPUs and the reference backend; "
     "on a CPU, fp32 with a note) or `auto`: bf16 on a GPU with bf16 tensor cores, and on a CPU "
     "whose bf16 GEMMs run at least 1.2x as fast as its f32 ones (AMX, Zen 4's AVX512-BF16; not "
     "an Intel core's AVX512-BF16 without AMX), timed once per machine; else fp32. `bf16` where "
     "no bf16 GEMMs run (a CPU without AVX512-BF16 or AMX) is fp32 with a note. The run's "
     "config.resolved.yaml records the precision the run computed in (auto's choice, fp32 "
     "where bf16 or fp16 fell back at the run's start), which eval, predict and a resume keep."},
    {"train.threads", T::integer, "0",
     "Compute threads; 0: every CPU this process may use (more than that run one per CPU, with a "
     "warning)."},
    {"train.matmul_precision", T::string, "highest",
     "As PyTorch's `torch.set_float32_matmul_precision`: `highest` (f32 GEMMs in f32) or `high` "
     "(on a GPU, f32 GEMMs on TF32 tensor cores: 10-bit mantissa products, f32 sums; the CPU "
     "keeps f32)."},
    {"train.cuda_graphs", T::string, "auto",
     "`auto`: on a GPU, each training step after five warm-up steps is captured once as a CUDA "
     "graph and replayed for every later batch of its shapes (one launch instead of hundreds; "
     "a replayed run equals an eager one bit for bit); stateful and data-parallel runs stay "
     "eager, with a note. `off`: eager."},
    {"train.device_check", T::boolean, "true",
     "On a GPU (one process), the run's first step is first repeated on the CPU for as many rows "
     "of its batch as take about a second there (not at all for a model too large to copy or to "
     "run a row of in a few seconds): the same parameters and dropout masks, the loss "
     "and every parameter's gradient compared (within 1e-2 relative, 1e-1 with TF32, bf16 or "
     "fp16 GEMMs). The run says which rows agreed and how closely; a difference is a defect, "
     "and a warning says so. `false`: not run."},
    {"train.device", T::string, "auto",
     "`cpu`, `cuda` (the current GPU; an error where none can run the model) or `auto` (a GPU "
     "where one can run the model; else the CPU). eval, predict, "
     "generate and merge take a stored `cuda` as `auto`. SEQFORGE_BACKEND, when set, overrides "
     "it."},
    {"train.freeze_modules", T::string_list, "[]",
     "Modules (`embedding`, the cell's `lstm`, `gru` or `lnlstm`, `head`) not updated during the "
     "first "
     "freeze_epochs epochs."},
    {"train.freeze_epochs", T::integer, "0",
     "Epochs during which freeze_modules stay fixed: no update, no weight decay, their gradients "
     "left out of train.clip_grad_norm's norm (PyTorch's requires_grad False). When they join, "
     "their Adam moments and step count start from zero, as those of parameters PyTorch's "
     "optimizer had never stepped."},
    {"train.clip_grad_norm", T::number, "0.0",
     "Clip the gradients' total L2 norm to this; 0: no clipping."},
    {"train.schedule", T::string, "constant",
     "Learning rate after warm-up: `constant`, `step` (times gamma every step_epochs, counted "
     "from the first epoch, warm-up included: PyTorch's StepLR), `cosine` "
     "(0.5 lr (1 + cos(pi p)), p the share of the steps after warm-up taken: from lr towards 0, "
     "which it would reach a step after the last, as Hugging Face's schedule) or `plateau` (times "
     "gamma when the monitored metric stalls plateau_patience epochs, as Keras' ReduceLROnPlateau: "
     "PyTorch's with patience one less; improvement by more than early_stopping.min_delta in "
     "early_stopping.mode's direction, counted from the first epoch that ends after warm-up). "
     "metrics.jsonl's `lr` is the rate of each epoch's last step."},
    {"train.warmup_steps", T::integer, "0",
     "Steps of linear warm-up to optim.lr: step s (from 0) takes lr (s + 1) / warmup_steps."},
    {"train.step_epochs", T::integer, "10", "`step` schedule: epochs between decays."},
    {"train.gamma", T::number, "0.1",
     "`step` and `plateau` schedules: the decay factor (plateau: below 1)."},
    {"train.plateau_patience", T::integer, "2",
     "`plateau` schedule: epochs without improvement before a decay."},
    {"train.early_stopping.patience", T::integer, "0",
     "Stop after this many epochs without improvement of the monitored metric; 0: never."},
    {"train.early_stopping.min_delta", T::number, "0.0",
     "The least change that counts as an improvement (also for `save: best` and the plateau "
     "schedule)."},
    {"train.early_stopping.monitor", T::string, "auto",
     "The metric watched by early stopping, the plateau schedule and `save: best`: train_loss, "
     "val_loss or the task's: forecast val_mse, val_rmse, val_mae, val_skill, val_mase (and "
     "val_pinball with quantiles, val_mae_hK and val_rmse_hK with several steps); classify and "
     "text_classify val_accuracy, val_f1; charlm val_bpc, val_perplexity; lm "
     "val_bits_per_token, val_perplexity. `auto`: val_loss, or train_loss when data.split.val "
     "is 0."},
    {"train.early_stopping.mode", T::string, "auto",
     "`min`, `max` or `auto` (max for accuracy, F1 and skill, min for losses and errors): which "
     "direction is better for the monitored metric."},
    {"train.save", T::string, "best",
     "`best` (the best epoch by the monitored metric: a later epoch replaces it only by improving "
     "on it by more than early_stopping.min_delta, as Keras' restore_best_weights), `last` or "
     "`every_n` (every save_every epochs, and the last)."},
    {"train.save_every", T::integer, "1", "`every_n`: epochs between checkpoints."},
    {"train.stateful", T::boolean, "false",
     "Stateful training: consecutive batches continue consecutive stretches of the data (each "
     "row of a batch a stream through its own stretch, windows one lookback apart: data.stride "
     "must divide data.lookback; the last chunks, fewer than the streams, are left out), and "
     "the recurrent layers' final states of a batch (detached) start the next one: truncated "
     "back-propagation through time over data.lookback (data.seq_len) steps. States are reset at "
     "every epoch, at series boundaries and where a gap in the dates lies between two chunks. "
     "Needs a unidirectional model, data.split.mode time and one process; validation stays "
     "stateless."},
    {"train.test_after", T::boolean, "true",
     "After training, evaluate the saved model on the test split (when it has windows): test_* "
     "metrics on the console, in metrics.jsonl (a line with `\"split\": \"test\"`) and in the "
     "report."},
    {"train.run_dir", T::path, "",
     "Where checkpoints, metrics.jsonl and the resolved config go; it must not hold another run "
     "(`train --overwrite` replaces it) nor be in use by another training process (its "
     "`.lock`). Default: runs/<config file name>, or runs/<name>-2, -3, ... when that holds a "
     "run or is in use."},
    {"dist.timeout_seconds", T::number, "120",
     "Under mpirun: a collective that takes longer (a rank died or hangs) ends the job with an "
     "error. Must exceed rank 0's validation and checkpoint time per epoch."},
    {"dist.bucket_mb", T::number, "4",
     "Under mpirun: megabytes of gradients per all-reduce, started while backward runs."},
};

// Every integer key's range: what a model and a machine can hold. Sizes far beyond these overflow
// the products of sizes (parameters, activations) long before they would fit in memory.
struct IntegerRange {
  const char* path;
  int64_t lo, hi;
};
constexpr int64_t kMillion = 1'000'000;
const IntegerRange kIntegerRanges[] = {
    {"data.lookback", 1, kMillion},
    {"data.horizon", 0, kMillion},
    {"data.stride", 1, kMillion},
    {"data.season", 0, kMillion},
    {"data.seq_len", 1, kMillion},
    {"data.prefetch_factor", 1, 64},
    {"augment.magnitude_warp.knots", 1, 1000},
    {"augment.time_warp.knots", 1, 1000},
    {"augment.cache_versions", 1, 1000},
    {"model.hidden", 1, 65536},
    {"model.proj_size", 0, 65536},
    {"model.layers", 1, 1024},
    {"model.heads", 1, 4096},
    {"model.block_size", 0, kMillion},
    {"model.embedding", 1, 65536},
    {"adapter.rank", 1, 65536},
    {"train.epochs", 1, kMillion},
    {"train.batch_size", 1, kMillion},
    {"train.micro_batch_size", 0, kMillion},
    {"train.max_batches", 0, 1000 * kMillion},
    {"train.seed", INT64_MIN, INT64_MAX},
    {"train.threads", 0, 4096},
    {"train.freeze_epochs", 0, kMillion},
    {"train.warmup_steps", 0, 1000 * kMillion},
    {"train.step_epochs", 1, kMillion},
    {"train.plateau_patience", 1, kMillion},
    {"train.early_stopping.patience", 0, kMillion},
    {"train.save_every", 1, kMillion},
};

const IntegerRange& integer_range(const std::string& path) {
  for (const IntegerRange& r : kIntegerRanges)
    if (path == r.path) return r;
  fail("internal: integer key ", path, " has no range");
}

// String keys that take one of a few words: checked as the config is read, before the data.
const std::vector<std::string>* string_choices(const std::string& path) {
  static const std::map<std::string, std::vector<std::string>> kChoices = {
      {"model.family", {"recurrent", "transformer", "decoder"}},
      {"model.cell", {"lstm", "gru", "lnlstm"}},
      {"model.output", {"last", "every_step", "final_states"}},
      {"adapter.kind", {"none", "lora", "dora"}},
      {"optim.kind", {"adamw", "adam", "sgd"}},
      {"optim.decay_params", {"auto", "all", "matrices"}},
      {"train.loss", {"mse", "mae", "huber", "quantile"}},
      {"train.precision", {"auto", "fp32", "bf16", "fp16"}},
      {"train.matmul_precision", {"highest", "high"}},
      {"train.device", {"auto", "cpu", "cuda"}},
      {"train.schedule", {"constant", "step", "cosine", "plateau"}},
      {"train.early_stopping.mode", {"auto", "min", "max"}},
      {"train.save", {"best", "last", "every_n"}},
  };
  const auto it = kChoices.find(path);
  return it == kChoices.end() ? nullptr : &it->second;
}

// "a, b or c"
std::string one_of(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i)
    s += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return s;
}

// Integer keys that also take `auto`, resolved once the run knows its device and model.
bool integer_takes_auto(const std::string& path) { return path == "train.micro_batch_size"; }

std::string range_text(const IntegerRange& r) {
  if (r.lo == INT64_MIN) return "any";
  return std::to_string(r.lo) + " to " + std::to_string(r.hi);
}

const char* type_name(T t) {
  switch (t) {
    case T::string:
      return "string";
    case T::integer:
      return "integer";
    case T::number:
      return "number";
    case T::boolean:
      return "boolean";
    case T::string_list:
      return "list of strings";
    case T::string_map:
      return "map of column to transform";
    case T::path:
      return "path";
  }
  return "";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t prev = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cur = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, prev + (a[i - 1] == b[j - 1] ? 0 : 1)});
      prev = cur;
    }
  }
  return row[b.size()];
}

// Other trainers' names for settings (Hugging Face's TrainingArguments, Lightning, Keras), with
// what they are here.
const std::map<std::string, std::string>& other_trainers_names() {
  static const std::map<std::string, std::string> names = {
      {"gradient_accumulation_steps", "train.micro_batch_size"},
      {"accumulate_grad_batches", "train.micro_batch_size"},
      {"grad_accum", "train.micro_batch_size"},
      {"gradient_accumulation", "train.micro_batch_size"},
      {"learning_rate", "optim.lr"},
      {"num_train_epochs", "train.epochs"},
      {"max_epochs", "train.epochs"},
      {"per_device_train_batch_size", "train.batch_size"},
      {"max_grad_norm", "train.clip_grad_norm"},
      {"gradient_clip_val", "train.clip_grad_norm"},
      {"lr_scheduler_type", "train.schedule"},
      {"hidden_size", "model.hidden"},
      {"num_layers", "model.layers"},
      {"n_layer", "model.layers"},
      {"num_hidden_layers", "model.layers"},
      {"n_head", "model.heads"},
      {"num_heads", "model.heads"},
      {"num_attention_heads", "model.heads"},
      {"n_embd", "model.embedding"},
      {"d_model", "model.embedding"},
      {"embedding_dim", "model.embedding"},
      {"rnn_type", "model.cell"},
      {"cell_type", "model.cell"},
      {"lookback_window", "data.lookback"},
      {"pred_len", "data.horizon"},
      {"forecast_horizon", "data.horizon"},
      {"optimizer", "optim.kind"},
  };
  return names;
}

bool is_prefix_of_key(const std::string& path);

std::string did_you_mean(const std::string& path) {
  const std::string last = path.substr(path.rfind('.') + 1);
  if (const auto other = other_trainers_names().find(last); other != other_trainers_names().end()) {
    if (other->second == "model.hidden")
      return " (seqforge's name: 'model.hidden' for a recurrent layer, 'model.embedding' for a "
             "transformer's width)";
    if (other->second != "train.micro_batch_size")
      return " (seqforge's name: '" + other->second + "')";
    return " (seqforge's train.batch_size is a step's batch, and train.micro_batch_size the "
           "examples run at once, whose gradients add up: batch_size / micro_batch_size "
           "accumulation steps)";
  }
  // A section named where a key goes (tune.space.model: ...): its keys, not a typo of itself.
  if (is_prefix_of_key(path)) {
    std::string some;
    int shown = 0;
    for (const auto& k : kKeys)
      if (k.path.rfind(path + ".", 0) == 0 && shown++ < 3)
        some += (some.empty() ? "'" : ", '") + k.path + "'";
    return " (a section: name one of its keys, such as " + some + ")";
  }
  // A section's name mistyped (modle:, traing:).
  if (path.find('.') == std::string::npos) {
    std::string section;
    size_t section_d = SIZE_MAX;
    for (const auto& k : kKeys) {
      const std::string first = k.path.substr(0, k.path.find('.'));
      if (const size_t d = edit_distance(path, first); d < section_d)
        section_d = d, section = first;
    }
    if (edit_distance(path, "tune") < section_d)
      section_d = edit_distance(path, "tune"), section = "tune";
    if (section_d <= 2) return " (did you mean '" + section + "'?)";
  }
  if (path == "model.type" || path == "model.kind" || path == "model.name")
    return " (seqforge's names: 'model.cell' for the recurrent cell: lstm, gru or lnlstm; "
           "'model.family': recurrent, transformer or decoder)";
  const ConfigKey* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const auto& k : kKeys) {
    const std::string k_last = k.path.substr(k.path.rfind('.') + 1);
    const size_t d = std::min(edit_distance(path, k.path), edit_distance(last, k_last) + 1);
    if (d < best_d) {
      best_d = d;
      best = &k;
    }
  }
  // A one-letter name is a step away from every other one-letter name: no typo of any.
  if (best && last.size() > 1 && best_d <= std::max<size_t>(2, last.size() / 3))
    return " (did you mean '" + best->path + "'?)";
  return "";
}

const ConfigKey* find_key(const std::string& path) {
  for (const auto& k : kKeys)
    if (k.path == path) return &k;
  return nullptr;
}

bool is_prefix_of_key(const std::string& path) {
  for (const auto& k : kKeys)
    if (k.path.rfind(path + ".", 0) == 0) return true;
  return false;
}

bool parse_int(const std::string& s, int64_t* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_double(const std::string& s, double* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

bool parse_bool(const std::string& s, bool* out) {
  if (s == "true" || s == "True" || s == "yes" || s == "on") return *out = true, true;
  if (s == "false" || s == "False" || s == "no" || s == "off") return *out = false, true;
  return false;
}

// Checks `node` against the key's type; returns the value as canonical YAML text.
std::string canonical(const ConfigKey& key, const YAML::Node& node, const std::string& where) {
  auto bad = [&](const std::string& got) -> std::string {
    // Nothing (null, or an empty override) where a value is needed: a key is unset by leaving
    // it out.
    const std::string unset =
        got == "nothing" && !key.default_value.empty()
            ? " (leave the key out for its default, " + key.default_value + ")"
            : "";
    fail(where, ": ", key.path, ": expected ", (key.type == T::integer ? "an " : "a "),
         type_name(key.type), ", got ", got, unset);
  };
  if (key.type == T::string_map) {
    if (node.IsNull() || (node.IsScalar() && node.Scalar().empty())) return "{}";
    if (!node.IsMap()) return bad(node.IsSequence() ? "a list" : "'" + node.Scalar() + "'");
    YAML::Emitter out;  // flow style, which quotes what a flow collection would misread
    out << YAML::Flow << YAML::BeginMap;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar() || !kv.second.IsScalar()) return bad("a nested list or map");
      out << YAML::Key << kv.first.Scalar() << YAML::Value << kv.second.Scalar();
    }
    out << YAML::EndMap;
    return out.c_str();
  }
  if (key.type == T::string_list) {
    if (node.IsNull()) return "[]";
    if (node.IsMap()) return bad("a map");
    YAML::Emitter out;
    out << YAML::Flow << YAML::BeginSeq;
    if (node.IsScalar() && !node.Scalar().empty()) out << node.Scalar();
    for (size_t i = 0; node.IsSequence() && i < node.size(); ++i) {
      if (node[i].IsNull())  // nothing, or a word YAML reads as null
        return bad("an empty entry (entry " + std::to_string(i) +
                   "; YAML reads null, Null, NULL and ~ as none: quote one meant as text, "
                   "\"NULL\")");
      if (!node[i].IsScalar()) return bad("a nested list or map");
      out << node[i].Scalar();
    }
    out << YAML::EndSeq;
    return out.c_str();
  }
  if (const auto* words = string_choices(key.path); words && !node.IsSequence() && !node.IsMap()) {
    const std::string s = node.IsScalar() ? node.Scalar() : "";
    if (std::find(words->begin(), words->end(), s) == words->end())
      fail(where, ": ", key.path, " must be ", one_of(*words), ", got '", s, "'");
    return s;
  }
  // An empty string or path may be written as nothing (`date_column:`).
  if (node.IsNull() && (key.type == T::string || key.type == T::path)) return "";
  if (!node.IsScalar())
    return bad(node.IsSequence() ? "a list" : node.IsMap() ? "a map" : "nothing");
  const std::string s = node.Scalar();
  // A quote left open takes in the lines after it, keys and all, as this value (YAML folds their
  // line breaks into spaces): "/data/x.csv task: charlm".
  if ((key.type == T::string || key.type == T::path) && node.Tag() == "!" &&
      key.path != "data.separator" && key.path != "data.eos_token")
    for (size_t at = s.find(": "); at != std::string::npos; at = s.find(": ", at + 1)) {
      size_t begin = at;
      while (begin > 0 &&
             (std::isalnum(static_cast<unsigned char>(s[begin - 1])) || s[begin - 1] == '_'))
        --begin;
      if (begin == at || begin == 0 || !std::isspace(static_cast<unsigned char>(s[begin - 1])))
        continue;
      fail(where, ": ", key.path, ": the quoted value takes in '",
           io::printable(s.substr(begin, s.find_first_of(" \n", at + 2) - begin), 40),
           "', a key and its value (a quote left open?)");
    }
  // Numbers and truth values in one spelling each: 0.70 and 0.7, 1e-3 and 0.001, on and true are
  // one setting wherever two configs are compared (a resume, a study's trials).
  int64_t i;
  double d;
  bool b;
  switch (key.type) {
    case T::integer: {
      if (s == "auto" && integer_takes_auto(key.path)) return s;
      const IntegerRange& r = integer_range(key.path);
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
      if (ec == std::errc::result_out_of_range && end == s.data() + s.size())
        fail(where, ": ", key.path, " must be in [", r.lo, ", ", r.hi, "], got ", s);
      if (!parse_int(s, &i)) return bad(s.empty() ? "nothing" : "'" + s + "'");
      if (i < r.lo && r.lo == 1) fail(where, ": ", key.path, " must be positive, got ", i);
      if (i < r.lo || i > r.hi)
        fail(where, ": ", key.path, " must be in [", r.lo, ", ", r.hi, "], got ", i);
      return std::to_string(i);
    }
    case T::number: {
      if (s == "auto" && key.default_value == "auto") return s;
      if (!parse_double(s, &d)) return bad(s.empty() ? "nothing" : "'" + s + "'");
      char text[32];
      const auto end = std::to_chars(text, text + sizeof text, d).ptr;
      return std::string(text, end);
    }
    case T::boolean:
      if (!parse_bool(s, &b)) return bad(s.empty() ? "nothing" : "'" + s + "'");
      return b ? "true" : "false";
    default:
      return s;
  }
}

}  // namespace

const std::vector<ConfigKey>& config_keys() { return kKeys; }

std::string config_key_suggestion(const std::string& path) { return did_you_mean(path); }

std::string canonical_value(const std::string& path, const std::string& text) {
  const ConfigKey* key = find_key(path);
  if (!key || (key->type != T::integer && key->type != T::number && key->type != T::boolean))
    return text;
  try {
    return canonical(*key, YAML::Load(text), path);
  } catch (const std::exception&) {
    return text;
  }
}

std::string closest_word(const std::string& word, const std::vector<std::string>& words) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const std::string& w : words)
    if (const size_t d = edit_distance(word, w); d < best_d) best_d = d, best = w;
  return best_d <= std::max<size_t>(2, word.size() / 3) ? best : "";
}

std::string config_reference_markdown() {
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "`seqforge train CONFIG.yaml [key.path=value ...]` reads a YAML file of the keys below; "
         "overrides use the same dotted paths, their values parsed as YAML. Unknown keys are "
         "errors; a key the run does not use (a time-series key on a text task, a schedule's "
         "setting under another schedule, an optimizer's under another optimizer) is a warning "
         "at start-up. Every run directory holds `config.resolved.yaml`: each key with its value, "
         "defaults filled in. An integer key takes the range its type shows (what a model and "
         "a machine can hold); a value outside it is an error.\n\n"
      << "This page is generated from the table in src/train/config.cpp "
         "(`seqforge config-reference > docs/config.md`); a test fails when they differ.\n\n"
      << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& k : kKeys) {
    std::string shown;  // the default as one line: a newline as \n
    for (const char ch : k.default_value)
      shown += ch == '\n' ? std::string("\\n") : std::string(1, ch);
    std::string type = k.type == T::integer && integer_range(k.path).lo != INT64_MIN
                           ? "integer, " + range_text(integer_range(k.path))
                           : type_name(k.type);
    if (integer_takes_auto(k.path)) type += ", or auto";
    out << "| `" << k.path << "` | " << type << " | " << (shown.empty() ? "" : "`" + shown + "`")
        << " | " << k.doc << " |\n";
  }
  out << "\n## The `tune:` section\n\n"
      << "`seqforge tune CONFIG.yaml [key.path=value ...]` searches the keys of the config's "
         "`tune:` section, which a training run ignores; overrides beginning with `tune.` set "
         "the section (a map merges into the key it names, as a training override's does: "
         "`tune.sampler={seed: 5}` keeps the file's sampler kind), the others every trial's "
         "config. See [tuning.md](tuning.md).\n\n"
      << "| key | default | meaning |\n|---|---|---|\n"
      << "| `tune.name` | the config's file name | the study's name |\n"
      << "| `tune.direction` | maximize for an accuracy, F1 or skill, else minimize | minimize "
         "or maximize `tune.metric` |\n"
      << "| `tune.metric` | `train.early_stopping.monitor` | the metric each trial reports per "
         "epoch |\n"
      << "| `tune.value` | `best` | which epoch gives a trial's value (and its kept checkpoint): "
         "`best` or `last` |\n"
      << "| `tune.n_trials` | `20` | the study's trials in all (`--n-trials` overrides) |\n"
      << "| `tune.timeout` | `0` | seconds after which no trial starts; 0: none |\n"
      << "| `tune.heartbeat_interval` | `10` | seconds between a running trial's heartbeats |\n"
      << "| `tune.grace_period` | `60` | seconds without a heartbeat after which a trial's worker "
         "is taken for dead |\n"
      << "| `tune.trials_per_device` | `1` | trials trained at once on the device, each in its own "
         "`seqforge tune` worker process on the study (its console in `worker-K.log` beside "
         "the study; on a CPU each trial takes its share of the cores unless train.threads is "
         "set); `auto`: as many as the GPU's memory holds, from what the first trial took (one "
         "at a time on a CPU) |\n"
      << "| `tune.sampler` | `{kind: tpe}` | `kind`: tpe, random or grid; `seed`, "
         "`n_startup_trials`, ... |\n"
      << "| `tune.pruner` | `{kind: median}` | `kind`: median, percentile, successive_halving or "
         "none; `n_startup_trials`, `n_warmup_steps`, ... |\n"
      << "| `tune.space` | | config key -> `{type: float, low, high, log, step}`, `{type: int, "
         "low, high, step, log}` or `{type: categorical, choices: [...]}` |\n";
  return out.str();
}

namespace {
constexpr size_t kMaxExpandedBytes = size_t{4} << 20;
}  // namespace

Config Config::load(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, ": cannot open the config file");
  // A regular file (not a device that never ends), and no larger than a config expands to.
  if (std::filesystem::is_regular_file(path, ec) &&
      std::filesystem::file_size(path, ec) > kMaxExpandedBytes)
    fail(path, ": ", std::filesystem::file_size(path, ec) >> 20,
         " MB, more than a config may hold (", kMaxExpandedBytes >> 20, " MB)");
  return parse(io::read_file(path), path, overrides);
}

namespace {

constexpr int kMaxDepth = 64;

// Adds `node`'s expanded size (scalars' bytes, 8 per node) to `total`; false once past the bound
// or nested deeper than kMaxDepth.
bool within_expansion_bound(const YAML::Node& node, size_t* total, int depth = 0) {
  *total += 8;
  if (node.IsScalar()) *total += node.Scalar().size();
  if (*total > kMaxExpandedBytes || depth > kMaxDepth) return false;
  if (node.IsSequence() || node.IsMap())
    for (const auto& item : node) {
      if (node.IsMap()) {
        if (!within_expansion_bound(item.first, total, depth + 1) ||
            !within_expansion_bound(item.second, total, depth + 1))
          return false;
      } else if (!within_expansion_bound(item, total, depth + 1)) {
        return false;
      }
    }
  return true;
}

// A tag of YAML's core schema (!!str, !!int, ...) says what the value already is; any other
// (!custom, !!python/object) asks for a reading no config has.
void check_yaml_tags(const YAML::Node& node, const std::string& source, bool lines = true) {
  const std::string& tag = node.Tag();
  static const std::set<std::string> core = {"",
                                             "?",
                                             "!",
                                             "tag:yaml.org,2002:str",
                                             "tag:yaml.org,2002:int",
                                             "tag:yaml.org,2002:float",
                                             "tag:yaml.org,2002:bool",
                                             "tag:yaml.org,2002:null",
                                             "tag:yaml.org,2002:seq",
                                             "tag:yaml.org,2002:map"};
  if (!core.count(tag))
    fail(source, lines ? ":" + std::to_string(node.Mark().line + 1) : "", ": the YAML tag '",
         io::printable(tag, 40), "' asks for a reading a config does not have; remove it");
  if (node.IsSequence() || node.IsMap())
    for (const auto& item : node) {
      if (node.IsMap()) {
        check_yaml_tags(item.first, source, lines);
        check_yaml_tags(item.second, source, lines);
      } else {
        check_yaml_tags(item, source, lines);
      }
    }
}
}  // namespace

void check_yaml_expansion(const YAML::Node& root, const std::string& source) {
  if (size_t total = 0; !within_expansion_bound(root, &total))
    fail(source, ": expands to more than ", kMaxExpandedBytes >> 20,
         " MB of YAML or nests deeper than ", kMaxDepth,
         " levels (anchors and aliases repeat their text); a config is far smaller");
}

std::string yaml_error(const YAML::Exception& e) {
  if (dynamic_cast<const YAML::DeepRecursion*>(&e))
    return "nests deeper than " + std::to_string(kMaxDepth) + " levels; a config is far shallower";
  return e.msg;
}

namespace {
// A quoted value of blank lines alone, as PyYAML writes "\n" ('<newline><newline>  '): YAML folds
// it into one line break per blank line between the quotes (a space where there is none), which
// yaml-cpp reads as empty. The value, when `at` starts such a scalar in `yaml`.
std::optional<std::string> quoted_blank_lines(std::string_view yaml, size_t at) {
  if (at >= yaml.size() || (yaml[at] != '\'' && yaml[at] != '"')) return std::nullopt;
  const size_t close = yaml.find(yaml[at], at + 1);
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view inside = yaml.substr(at + 1, close - at - 1);
  if (inside.find_first_not_of(" \t\r\n") != std::string_view::npos) return std::nullopt;
  const auto breaks = std::count(inside.begin(), inside.end(), '\n');
  if (breaks == 0) return std::nullopt;
  return breaks == 1 ? std::string(" ") : std::string(breaks - 1, '\n');
}

// The line of a document marker ("---" or "...", at the start of a line) that has content
// after it and follows the first document's content; 0 when the text is one document.
int64_t second_document_line(std::string_view yaml) {
  const auto is_marker = [](std::string_view line) {
    return (line.starts_with("---") || line.starts_with("...")) &&
           (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
  };
  const auto is_content = [](std::string_view line) {
    const size_t first = line.find_first_not_of(" \t\r");
    return first != std::string_view::npos && line[first] != '#' && line[0] != '%';
  };
  bool content = false;
  int64_t marker = 0, number = 0;
  for (size_t at = 0; at < yaml.size();) {
    const size_t end = std::min(yaml.find('\n', at), yaml.size());
    const std::string_view line = yaml.substr(at, end - at);
    at = end + 1;
    ++number;
    const bool at_marker = is_marker(line);
    if (at_marker && content && !marker) marker = number;
    if (is_content(at_marker ? line.substr(3) : line)) {  // "--- {a: 1}" holds content too
      if (marker) return marker;
      content = true;
    }
  }
  return 0;
}
}  // namespace

std::string yaml_key(const YAML::Node& key, const std::string& where) {
  if (!key.IsScalar())
    fail(where, ": a key must be a name, not a ", key.IsSequence() ? "list" : "map");
  return key.Scalar();
}

Config Config::parse(const std::string& yaml, const std::string& source,
                     const std::vector<std::string>& overrides) {
  Config c;
  c.source_ = source;
  // YAML is Unicode; a value with other bytes would not survive being written back (config_fuzz).
  if (const size_t at = io::first_non_utf8(yaml); at != std::string::npos)
    fail(source, ":", 1 + std::count(yaml.begin(), yaml.begin() + static_cast<ptrdiff_t>(at), '\n'),
         ": not UTF-8 text (byte ", at, "); save the config as UTF-8");
  // YAML allows no control bytes but tab and line ends; yaml-cpp reads a NUL as the text's end
  // and reports a later line.
  for (size_t at = 0; at < yaml.size(); ++at)
    if (const auto ch = static_cast<unsigned char>(yaml[at]);
        (ch < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') || ch == 0x7f) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02x", ch);
      fail(source, ":",
           1 + std::count(yaml.begin(), yaml.begin() + static_cast<ptrdiff_t>(at), '\n'),
           ": a control byte (", byte, ch == 0 ? ", NUL" : "",
           "), which YAML does not allow; save the config as UTF-8 text",
           ch == 0 ? " (a NUL beside every letter is UTF-16)" : "");
    }
  // A second document ("---" and more keys) would be left out without a word. Found in the text:
  // yaml-cpp's LoadAll ran without end on some malformed input (config_fuzz).
  if (const int64_t line = second_document_line(yaml))
    fail(source, ":", line,
         ": a second YAML document ('---'): a config is one document; merge them");
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    fail(source, ":", e.mark.line + 1, ": not valid YAML: ", yaml_error(e));
  }
  if (!root.IsNull() && !root.IsMap()) fail(source, ": expected a map of keys at the top level");
  check_yaml_expansion(root, source);
  check_yaml_tags(root, source);
  // Walks nested maps down to known keys.
  auto walk = [&](auto&& self, const YAML::Node& map, const std::string& prefix) -> void {
    std::set<std::string> seen;  // YAML leaves a repeated key to the reader: the last would win
    for (const auto& kv : map) {
      const std::string where = source + ":" + std::to_string(kv.first.Mark().line + 1);
      const std::string name = yaml_key(kv.first, where);
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      if (!seen.insert(name).second) fail(where, ": '", path, "' is given twice");
      // The search space of `seqforge tune`, read by src/tune; a training run ignores it.
      if (path == "tune") continue;
      if (const ConfigKey* key = find_key(path)) {
        const std::optional<std::string> blank =
            kv.second.IsScalar() && kv.second.Scalar().empty()
                ? quoted_blank_lines(yaml, kv.second.Mark().pos)
                : std::nullopt;
        c.values_[path] = canonical(*key, blank ? YAML::Node(*blank) : kv.second, where);
        c.where_[path] = where;
      } else if (kv.second.IsMap() && is_prefix_of_key(path)) {
        self(self, kv.second, path);
      } else {
        fail(where, ": unknown key '", path, "'", did_you_mean(path));
      }
    }
  };
  if (root.IsMap()) walk(walk, root, "");
  for (const std::string& o : overrides) {
    // Errors quote the override, a long one cut short (at a character's first byte).
    size_t cut = o.size();
    if (cut > 120)
      for (cut = 117; cut > 0 && (static_cast<unsigned char>(o[cut]) & 0xc0) == 0x80;) --cut;
    const std::string named = "override '" + o.substr(0, cut) + (cut < o.size() ? "..." : "") + "'";
    const size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) fail(named, ": expected key.path=value");
    if (const size_t at = io::first_non_utf8(o); at != std::string::npos)
      fail(named, ": not UTF-8 text (byte ", at, ")");
    const std::string path = o.substr(0, eq);
    // YAML reads "#..." as a comment, so the value would be nothing: the default, silently.
    if (const std::string_view text = io::trim(std::string_view(o).substr(eq + 1));
        text.starts_with('#')) {
      // YAML's double quotes inside the shell's single ones reach YAML as written, where the
      // text holds no quote, backslash or '$'.
      const bool plain = text.find_first_of("'\"\\$`") == std::string_view::npos;
      fail(named, ": the value starts with '#', which YAML reads as a comment (no value); ",
           plain ? "quote it: '" + path + "=\"" + std::string(text) + "\"'"
                 : std::string("quote it in the config file instead"));
    }
    YAML::Node value;
    try {
      value = YAML::Load(o.substr(eq + 1));
    } catch (const YAML::Exception& e) {
      fail(named, ": not valid YAML: ", yaml_error(e));
    }
    check_yaml_expansion(value, named);
    check_yaml_tags(value, named, false);
    if (value.IsNull()) value = YAML::Node(std::string());
    // A key, or a section given as a map of its keys (train.early_stopping={patience: 3}).
    auto set = [&](auto&& self, const std::string& at, const YAML::Node& v) -> void {
      if (const ConfigKey* key = find_key(at)) {
        c.values_[at] = canonical(*key, v, named);
        c.where_[at] = named;
      } else if (v.IsMap() && is_prefix_of_key(at)) {
        for (const auto& kv : v) self(self, at + "." + yaml_key(kv.first, named), kv.second);
      } else {
        fail(named, ": unknown key '", at, "'", did_you_mean(at));
      }
    };
    set(set, path, value);
  }
  c.resolve_auto();
  return c;
}

void Config::resolve_auto() {
  // Each key's value once the keys it depends on are known; is_set() stays as it was.
  auto resolve = [&](const std::string& key, const std::string& value) {
    if (str(key) == "auto") values_[key] = value;
  };
  resolve("optim.weight_decay", str("optim.kind") == "adamw" ? "0.01" : "0");
  resolve("optim.decay_params", str("model.family") == "transformer" ? "matrices" : "all");
  resolve("train.early_stopping.monitor", number("data.split.val") > 0 ? "val_loss" : "train_loss");
  resolve("train.early_stopping.mode",
          higher_is_better(str("train.early_stopping.monitor")) ? "max" : "min");
}

std::string yaml_string(const std::string& text) {
  YAML::Emitter out;
  out << YAML::DoubleQuoted << text;
  return out.c_str();
}

bool higher_is_better(const std::string& name) {
  return name.ends_with("accuracy") || name.ends_with("f1") || name.ends_with("skill");
}

Config Config::with_absolute_paths(const std::string& base_dir) const {
  Config c = *this;
  for (const auto& k : kKeys) {
    if (k.type != T::path) continue;
    const std::string value = str(k.path);
    if (value.empty() || std::filesystem::path(value).is_absolute()) continue;
    c.values_[k.path] = (std::filesystem::path(base_dir) / value).lexically_normal().string();
    c.written_[k.path] = value;
  }
  return c;
}

Config Config::with_values(const std::map<std::string, std::string>& values,
                           const std::string& where) const {
  Config c = *this;
  for (const auto& [key, value] : values) {
    c.values_[key] = canonical(key_of(key), YAML::Load(value), where);
    c.where_[key] = where;
  }
  return c;
}

const ConfigKey& Config::key_of(const std::string& key) const {
  const ConfigKey* k = find_key(key);
  SF_CHECK(k, "no config key ", key);
  return *k;
}

bool Config::is_set(const std::string& key) const { return where_.count(key) > 0; }

bool Config::differs_from_default(const std::string& key) const {
  const auto it = values_.find(key);
  if (it == values_.end()) return false;
  const ConfigKey& k = key_of(key);
  // A string's default is its text (data.separator's "\n" would read as YAML's null).
  YAML::Node fallback =
      k.type == T::string ? YAML::Node(std::string(k.default_value)) : YAML::Load(k.default_value);
  if (fallback.IsNull()) fallback = YAML::Node(std::string());
  return it->second != canonical(k, fallback, "the default of " + key);
}

const std::string& Config::origin(const std::string& key) const {
  const auto it = where_.find(key);
  return it == where_.end() ? source_ : it->second;
}

std::string Config::str(const std::string& key) const {
  auto it = values_.find(key);
  if (it != values_.end()) return it->second;
  // Defaults in the spelling a value given takes (the table's 0.0 is 0).
  static const std::map<std::string, std::string> defaults = [] {
    std::map<std::string, std::string> canonical_defaults;
    for (const ConfigKey& k : kKeys)
      canonical_defaults[k.path] = canonical_value(k.path, k.default_value);
    return canonical_defaults;
  }();
  key_of(key);  // an unknown key is an error
  return defaults.at(key);
}

int64_t Config::integer(const std::string& key) const {
  int64_t v = 0;
  SF_CHECK(key_of(key).type == T::integer && parse_int(str(key), &v), key);
  return v;
}

double Config::number(const std::string& key) const {
  double v = 0;
  SF_CHECK(key_of(key).type == T::number && parse_double(str(key), &v), key);
  return v;
}

bool Config::boolean(const std::string& key) const {
  bool v = false;
  SF_CHECK(key_of(key).type == T::boolean && parse_bool(str(key), &v), key);
  return v;
}

std::map<std::string, std::string> Config::map(const std::string& key) const {
  SF_CHECK(key_of(key).type == T::string_map, key);
  const YAML::Node node = YAML::Load(str(key));
  std::map<std::string, std::string> out;
  for (const auto& kv : node) out[kv.first.as<std::string>()] = kv.second.as<std::string>();
  return out;
}

std::vector<std::string> Config::list(const std::string& key) const {
  SF_CHECK(key_of(key).type == T::string_list, key);
  const YAML::Node node = YAML::Load(str(key));
  std::vector<std::string> out;
  for (const auto& item : node) out.push_back(item.as<std::string>());
  return out;
}

namespace {

// Text that a YAML reader could take for a number, a boolean or null ("2024", "no", "~", "1e3",
// "12:30" in YAML 1.1) is written quoted, so that every reader reads it back as text.
void emit_text(YAML::Emitter& out, const std::string& text) {
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::set<std::string> words = {"y",  "n",     "yes", "no",   "true",
                                              "on", "false", "off", "null", "~"};
  const bool misread =
      !text.empty() && (std::string_view("0123456789+-.").find(text[0]) != std::string_view::npos ||
                        words.count(lower) > 0);
  // Control characters escaped: yaml-cpp writes a carriage return plainly, read back as a break.
  const bool control = std::any_of(text.begin(), text.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  if (misread || control) out << YAML::DoubleQuoted;
  out << text;
}

// A string list or map, in flow style, its texts as emit_text writes them.
void emit_texts(YAML::Emitter& out, const YAML::Node& node) {
  if (node.IsSequence()) {
    out << YAML::Flow << YAML::BeginSeq;
    for (const auto& item : node) emit_texts(out, item);
    out << YAML::EndSeq;
  } else if (node.IsMap()) {
    out << YAML::Flow << YAML::BeginMap;
    for (const auto& item : node) {
      out << YAML::Key;
      emit_texts(out, item.first);
      out << YAML::Value;
      emit_texts(out, item.second);
    }
    out << YAML::EndMap;
  } else if (node.IsScalar()) {
    emit_text(out, node.Scalar());
  } else {
    out << node;
  }
}

}  // namespace

std::string Config::resolved_yaml() const {
  // Keys in table order, grouped by their dotted prefixes (the table keeps each group together).
  YAML::Emitter out;
  out << YAML::BeginMap;
  std::vector<std::string> open;  // the map keys currently open
  for (const auto& k : kKeys) {
    std::vector<std::string> parts;
    std::stringstream ss(k.path);
    for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
    size_t common = 0;
    while (common < open.size() && common + 1 < parts.size() && open[common] == parts[common])
      ++common;
    for (; open.size() > common; open.pop_back()) out << YAML::EndMap;
    for (; open.size() + 1 < parts.size(); open.push_back(parts[open.size()]))
      out << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;
    // Strings, paths and their lists as text; the rest is YAML text already.
    out << YAML::Key << parts.back() << YAML::Value;
    if (k.type == T::string || k.type == T::path)
      emit_text(out, str(k.path));
    else if (k.type == T::string_map || k.type == T::string_list)
      emit_texts(out, YAML::Load(str(k.path)));
    else
      out << YAML::Load(str(k.path));
    if (const auto it = written_.find(k.path); it != written_.end())
      out << YAML::Comment("as written: " + it->second);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace seqforge
